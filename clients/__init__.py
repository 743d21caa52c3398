"""The rlreplay clients: an async HTTP client, a synchronous one, and their msgpack wire codec.

Importable with only httpx, msgpack and numpy installed; torch is used only when a
tensor is handed over (and ``BFloat16Array.to_torch`` is called).
"""

from rlreplay.clients.client import Item, ReplayClient
from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.dataset import RolloutBatches, rollout_dataset
from rlreplay.clients.event_loop import WrongEventLoop
from rlreplay.clients.rollouts import Lease
from rlreplay.clients.sharded import ShardedReplayClient
from rlreplay.clients.sync_client import Client
from rlreplay.clients.sync_lease import SyncLease
from rlreplay.clients.sync_sharded import ShardedClient
from rlreplay.clients.sync_stream import SyncStream
from rlreplay.clients.sync_writer import SyncWriter
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
    "Client",
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
    "ShardedClient",
    "ShardedReplayClient",
    "SnapshotNotFound",
    "StorageFull",
    "SyncLease",
    "SyncStream",
    "SyncWriter",
    "TableExists",
    "TableNotFound",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "ValidationFailed",
    "VersionConflict",
    "Writer",
    "WrongEventLoop",
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
