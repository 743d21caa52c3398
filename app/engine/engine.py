"""INTERFACE DRAFT: the engine's public surface; the implementation lands here shortly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.engine.config import TableConfig
from app.engine.items import Item, NewItem, SampledItem
from app.settings import Settings


class Engine:
    """Tables of items over hybrid storage, mutated by one writer task.

    Lifetime: ``await engine.start()`` (recovers from ``data_dir``, starts the writer),
    ``await engine.stop()`` (idempotent: drains the writer, flushes, closes).
    Errors raised are those of ``clients.errors`` (TableNotFound, ValidationFailed,
    Overloaded, StorageFull, DeadlineExceeded, Unavailable...).
    """

    def __init__(self, settings: Settings) -> None: ...

    @property
    def ready(self) -> bool:
        """True once recovery finished and the writer runs."""
        raise NotImplementedError

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    async def create_table(self, name: str, config: TableConfig) -> bool:
        """True when created, False when it exists with the same config; TableExists otherwise."""
        raise NotImplementedError

    async def drop_table(self, name: str) -> None:
        """Deletes the table and its data; TableNotFound when missing."""

    def table_names(self) -> list[str]:
        raise NotImplementedError

    def describe(self, name: str) -> dict[str, Any]:
        """``{"name", "config": TableConfig.to_wire(), "stats": {size, pending_ops, ...}}``."""
        raise NotImplementedError

    async def push(self, table: str, items: Sequence[NewItem], *, wait: bool = False,
                   timeout_s: float | None = None) -> int:
        """Accepts items (visible to every reader on return); with wait, returns once applied."""
        raise NotImplementedError

    async def get(self, table: str, key: str) -> Item | None:
        raise NotImplementedError

    async def get_many(self, table: str, keys: Sequence[str]) -> list[Item | None]:
        raise NotImplementedError

    async def delete(self, table: str, keys: Sequence[str], *, wait: bool = False) -> int:
        raise NotImplementedError

    async def sample(self, table: str, batch_size: int, *, timeout_s: float | None = None,
                     include_values: bool = True) -> list[SampledItem]:
        raise NotImplementedError

    async def update_priorities(self, table: str, priorities: Mapping[str, float]) -> tuple[int, int]:
        """Returns (updated, missing)."""
        raise NotImplementedError

    async def flush(self) -> None:
        """Checkpoint: everything applied is in RocksDB (or the memory checkpoint), log truncated."""

    def queue_depths(self) -> dict[str, int]:
        """{"p0": ..., "p1": ...} for metrics."""
        raise NotImplementedError
