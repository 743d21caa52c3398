"""rlreplay: an experience replay service for reinforcement learning, over HTTP.

Users import the client from here (``from rlreplay import ReplayClient``); the service is
``rlreplay serve``. Importing this package loads the client and its wire codec only: no
server dependency, no torch, and nothing global changes. ``GpuSampler`` (the GPU sidecar's
library form, :mod:`rlreplay.gpu`) loads torch on first use.

Subpackages: :mod:`rlreplay.clients` (the async client), :mod:`rlreplay.wire` (errors and
the msgpack codec that client and server share), :mod:`rlreplay.app` (the service) and
:mod:`rlreplay.workers` (its single writer).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("rlreplay")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0"

__all__ = [
    "BFloat16Array",
    "BadRequest",
    "Client",
    "ColumnBatch",
    "DeadlineExceeded",
    "Gone",
    "GpuSampler",
    "Item",
    "ItemNotFound",
    "LeaseNotFound",
    "MethodNotAllowed",
    "NotConfigured",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "ReplayClient",
    "ReplayDataset",
    "ReplayError",
    "RolloutBatches",
    "ShardedClient",
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
    "WrongEventLoop",
    "__version__",
    "rollout_dataset",
    "tune_malloc",
]

if TYPE_CHECKING:
    from rlreplay.clients import (
        BadRequest,
        BFloat16Array,
        Client,
        ColumnBatch,
        DeadlineExceeded,
        Gone,
        Item,
        ItemNotFound,
        LeaseNotFound,
        MethodNotAllowed,
        NotConfigured,
        NotFound,
        Overloaded,
        PayloadTooLarge,
        ReplayClient,
        ReplayError,
        RolloutBatches,
        ShardedClient,
        ShardedReplayClient,
        SnapshotNotFound,
        StorageFull,
        TableExists,
        TableNotFound,
        Unauthorized,
        Unavailable,
        UnsupportedMediaType,
        ValidationFailed,
        VersionConflict,
        Writer,
        WrongEventLoop,
        rollout_dataset,
        tune_malloc,
    )
    from rlreplay.gpu import GpuSampler, ReplayDataset


def __getattr__(name: str) -> Any:
    """Loads the client on first use, so that ``import rlreplay.app`` (the service, and
    its log writer process) does not pay for httpx and the client's codec."""
    if name == "GpuSampler":
        from rlreplay import gpu

        return gpu.GpuSampler
    if name == "ReplayDataset":  # a torch IterableDataset of device batches: needs torch
        from rlreplay.gpu import dataset

        return dataset.ReplayDataset
    if name in __all__ and name != "__version__":
        from rlreplay import clients

        return getattr(clients, name)
    raise AttributeError(f"module 'rlreplay' has no attribute {name!r}")
