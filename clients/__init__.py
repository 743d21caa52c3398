"""The rlreplay client: an async HTTP client and its msgpack wire codec.

Importable with only httpx, msgpack and numpy installed; torch is used only when a
tensor is handed over (and ``BFloat16Array.to_torch`` is called).
"""

from rlreplay.clients.client import Item, ReplayClient
from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.dataset import RolloutBatches, rollout_dataset
from rlreplay.clients.rollouts import Lease
from rlreplay.clients.sharded import ShardedReplayClient
from rlreplay.clients.writer import Writer
from rlreplay.wire.allocator import tune_malloc
from rlreplay.wire.arrays import EXT_NDARRAY, BFloat16Array
from rlreplay.wire.codec import (
    from_jsonable,
    jsonable_to_msgpack,
    msgpack_to_jsonable,
    packb,
    spell_floats,
    to_jsonable,
    unpackb,
)
from rlreplay.wire.errors import (
    BadRequest,
    DeadlineExceeded,
    Gone,
    ItemNotFound,
    LeaseNotFound,
    MethodNotAllowed,
    NotConfigured,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    ReplayError,
    SnapshotNotFound,
    StorageFull,
    TableExists,
    TableNotFound,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    ValidationFailed,
    VersionConflict,
    error_from_body,
)

__all__ = [
    "EXT_NDARRAY",
    "BFloat16Array",
    "BadRequest",
    "ColumnBatch",
    "DeadlineExceeded",
    "Gone",
    "Item",
    "ItemNotFound",
    "Lease",
    "LeaseNotFound",
    "MethodNotAllowed",
    "NotConfigured",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "ReplayClient",
    "ReplayError",
    "RolloutBatches",
    "ShardedReplayClient",
    "SnapshotNotFound",
    "StorageFull",
    "TableExists",
    "TableNotFound",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "ValidationFailed",
    "VersionConflict",
    "Writer",
    "error_from_body",
    "from_jsonable",
    "jsonable_to_msgpack",
    "msgpack_to_jsonable",
    "packb",
    "rollout_dataset",
    "spell_floats",
    "to_jsonable",
    "tune_malloc",
    "unpackb",
]
