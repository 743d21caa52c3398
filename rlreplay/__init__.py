"""rlreplay: an experience replay service for reinforcement learning, over HTTP.

Users import the client from here (``from rlreplay import ReplayClient``); the service is
``rlreplay serve``. Importing this package loads nothing but this file: each public name is
loaded on first use, so ``import rlreplay.app`` (the service, and its log writer process)
pays nothing for the client, and nothing global changes. ``GpuSampler`` (the GPU sidecar's
library form, :mod:`rlreplay.gpu`) loads torch on first use. Two modules are imported by
name and load their framework: :mod:`rlreplay.ray` (servers as Ray actors, clients by name)
and :mod:`rlreplay.torchrl` (a TorchRL replay buffer over a table).

``__all__`` below is the public API, the one list of it: what is not in it (the modules of
:mod:`rlreplay.clients`, :mod:`rlreplay.wire`, :mod:`rlreplay.app`, :mod:`rlreplay.workers`,
their other names) is internal and may change between releases.
``tests/test_exports.py`` checks that every name in it loads, from where ``_ORIGINS`` and
the type checkers' imports below say.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Final

try:
    __version__ = version("rlreplay")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0"

__all__ = [
    "BFloat16Array",
    "BadRequest",
    "ClaimOptions",
    "Client",
    "ColumnBatch",
    "DeadlineExceeded",
    "Episode",
    "EpisodeWriter",
    "Gone",
    "GpuSampler",
    "Item",
    "ItemNotFound",
    "Lease",
    "LeaseNotFound",
    "MethodNotAllowed",
    "NotConfigured",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "ReplayCalls",
    "ReplayClient",
    "ReplayDataset",
    "ReplayError",
    "Reservation",
    "RolloutBatches",
    "ShardedClient",
    "ShardedLease",
    "ShardedReplayClient",
    "SnapshotNotFound",
    "StepConflict",
    "StorageFull",
    "SyncEpisodeWriter",
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
    "WindowBatch",
    "WindowOptions",
    "WindowTensors",
    "Writer",
    "WrongEventLoop",
    "__version__",
    "rollout_dataset",
    "tune_malloc",
]

if TYPE_CHECKING:
    from rlreplay.clients.client import ReplayClient
    from rlreplay.clients.columns import ColumnBatch
    from rlreplay.clients.dataset import RolloutBatches, rollout_dataset
    from rlreplay.clients.episode_writer import EpisodeWriter
    from rlreplay.clients.episodes import Episode
    from rlreplay.clients.event_loop import WrongEventLoop
    from rlreplay.clients.rollouts import Lease, Reservation
    from rlreplay.clients.sharded import ShardedReplayClient
    from rlreplay.clients.sharded_rollouts import ShardedLease
    from rlreplay.clients.surface import ClaimOptions, ReplayCalls, WindowOptions
    from rlreplay.clients.sync_client import Client
    from rlreplay.clients.sync_episode_writer import SyncEpisodeWriter
    from rlreplay.clients.sync_lease import SyncLease
    from rlreplay.clients.sync_sharded import ShardedClient
    from rlreplay.clients.sync_stream import SyncStream
    from rlreplay.clients.sync_writer import SyncWriter
    from rlreplay.clients.types import Item
    from rlreplay.clients.windows import WindowBatch, WindowTensors
    from rlreplay.clients.writer import Writer
    from rlreplay.gpu.dataset import ReplayDataset
    from rlreplay.gpu.sampler import GpuSampler
    from rlreplay.wire.allocator import tune_malloc
    from rlreplay.wire.arrays import BFloat16Array
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
        StepConflict,
        StorageFull,
        TableExists,
        TableNotFound,
        Unauthorized,
        Unavailable,
        UnsupportedMediaType,
        ValidationFailed,
        VersionConflict,
    )

#: The module that defines each public name but the errors (``rlreplay.wire.errors``).
_ORIGINS: Final = {
    "ClaimOptions": "rlreplay.clients.surface",
    "Client": "rlreplay.clients.sync_client",
    "ColumnBatch": "rlreplay.clients.columns",
    "Episode": "rlreplay.clients.episodes",
    "EpisodeWriter": "rlreplay.clients.episode_writer",
    "BFloat16Array": "rlreplay.wire.arrays",
    "GpuSampler": "rlreplay.gpu.sampler",  # needs torch, as ReplayDataset
    "Item": "rlreplay.clients.types",
    "Lease": "rlreplay.clients.rollouts",
    "ReplayCalls": "rlreplay.clients.surface",
    "ReplayClient": "rlreplay.clients.client",
    "ReplayDataset": "rlreplay.gpu.dataset",
    "Reservation": "rlreplay.clients.rollouts",
    "RolloutBatches": "rlreplay.clients.dataset",
    "ShardedClient": "rlreplay.clients.sync_sharded",
    "ShardedLease": "rlreplay.clients.sharded_rollouts",
    "ShardedReplayClient": "rlreplay.clients.sharded",
    "SyncEpisodeWriter": "rlreplay.clients.sync_episode_writer",
    "SyncLease": "rlreplay.clients.sync_lease",
    "SyncStream": "rlreplay.clients.sync_stream",
    "SyncWriter": "rlreplay.clients.sync_writer",
    "WindowBatch": "rlreplay.clients.windows",
    "WindowOptions": "rlreplay.clients.surface",
    "WindowTensors": "rlreplay.clients.windows",
    "Writer": "rlreplay.clients.writer",
    "WrongEventLoop": "rlreplay.clients.event_loop",
    "rollout_dataset": "rlreplay.clients.dataset",
    "tune_malloc": "rlreplay.wire.allocator",
}


def __getattr__(name: str) -> Any:
    """Loads a public name on first use (see the module's docstring for why)."""
    if name not in __all__:
        raise AttributeError(f"module 'rlreplay' has no attribute {name!r}")
    value = getattr(import_module(_ORIGINS.get(name, "rlreplay.wire.errors")), name)
    globals()[name] = value  # later lookups skip this function
    return value
