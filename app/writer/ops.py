"""The ops the single writer applies. Routes build them; only the writer executes them.

Urgent: :class:`PutOp`, :class:`DeleteOp`, :class:`PriorityOp`, :class:`PatchOp`,
:class:`AckOp`, :class:`VersionOp`, :class:`EpisodeAppendOp`, :class:`EpisodeDeleteOp`,
:class:`EpisodePriorityOp`, :class:`CreateTableOp`, :class:`DropTableOp`,
:class:`CheckpointOp`, :class:`SnapshotOp`.
Housekeeping: :class:`EvictOp`, :class:`PopulateOp`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem, PatchedItem

if TYPE_CHECKING:
    from rlreplay.app.tables.table import Table


@dataclass(slots=True, eq=False)
class Op:
    """Base of every op: ``seq`` orders it, ``future`` (if any) resolves once it is applied."""

    seq: int
    future: asyncio.Future[None] | None = field(default=None, kw_only=True)
    weight: int = field(default=1, kw_only=True)  # item ops it counts for in the queue bound
    nbytes: int = field(default=0, kw_only=True)  # value bytes it holds in the queue bound
    queued_at: float = field(default=0.0, kw_only=True)  # time.monotonic() when enqueued
    refused: bool = field(default=False, kw_only=True)  # its log record was lost: never applied
    #: Its keys are deleted (the pending index hides them until it is applied).
    deletes: ClassVar[bool] = False


@dataclass(slots=True, eq=False)
class PutOp(Op):
    """Insert or replace items.

    The writer may apply several queued pushes to one table as one op (see
    :meth:`~rlreplay.app.writer.task_processor.TaskProcessor.join_pushes`): ``parts`` then holds
    them, in order, and ``items`` their items one after another.
    """

    table: Table
    items: Sequence[NewItem]
    inserted_at: float
    parts: tuple[PutOp, ...] = ()


def queued_ops(op: Op) -> tuple[Op, ...]:
    """The queued ops ``op`` stands for: the pushes it joined, else itself."""
    return op.parts if type(op) is PutOp and op.parts else (op,)


@dataclass(slots=True, eq=False)
class DeleteOp(Op):
    """Delete keys (missing ones are ignored)."""

    deletes: ClassVar[bool] = True
    table: Table
    keys: Sequence[str]


@dataclass(slots=True, eq=False)
class PriorityOp(Op):
    """Set priorities of existing keys."""

    table: Table
    keys: Sequence[str]
    priorities: Sequence[float]


@dataclass(slots=True, eq=False)
class PatchOp(Op):
    """Replace existing items' values with the patched ones (merged when accepted), keeping
    everything else about them; keys gone meanwhile are skipped."""

    table: Table
    items: Sequence[PatchedItem]
    inserted_at: float = 0.0  # (what the pending index shows for a patch it rebuilds)


@dataclass(slots=True, eq=False)
class AckOp(Op):
    """``task`` consumed the items of ``keys`` (missing ones are skipped)."""

    table: Table
    task: str
    keys: Sequence[str]


@dataclass(slots=True, eq=False)
class VersionOp(Op):
    """The table's policy version moves forward to ``version``."""

    table: Table
    version: int


@dataclass(slots=True, eq=False)
class EpisodeAppendOp(Op):
    """Append ``k`` steps at ``start`` to an episode of an episode table (ending it with
    ``end``, with ``final`` values); ``accepted``: counted by the table's admission (False
    when the log is replayed)."""

    table: Table
    episode: str
    start: int
    steps: dict[str, Any]  # field -> ndarray, first axis k
    k: int
    priorities: list[float] | None = None
    end: str | None = None
    final: dict[str, Any] | None = None
    accepted: bool = True


@dataclass(slots=True, eq=False)
class EpisodeDeleteOp(Op):
    """Delete an episode of an episode table."""

    table: Table
    episode: str
    accepted: bool = True


@dataclass(slots=True, eq=False)
class EpisodePriorityOp(Op):
    """Set the priorities of windows: ``(episode, start, priority)`` each."""

    table: Table
    windows: list[tuple[str, int, float]]


@dataclass(slots=True, eq=False)
class CreateTableOp(Op):
    """Create a table (or find it exists with the same config)."""

    name: str
    config: TableConfig


@dataclass(slots=True, eq=False)
class DropTableOp(Op):
    """Delete a table and all its data."""

    table: Table


@dataclass(slots=True, eq=False)
class CheckpointOp(Op):
    """Make what is applied durable without the log, then truncate the log (see
    :meth:`rlreplay.app.writer.task_processor.TaskProcessor.checkpoint`); ``full``: everything;
    ``due``: queued by the log's cadence, not asked for (its cut may spare values)."""

    full: bool = False
    due: bool = False


@dataclass(slots=True, eq=False)
class SnapshotOp(Op):
    """Capture every table into ``dest`` at this op's place in the order (see
    :meth:`rlreplay.app.writer.checkpoints.Checkpointer.capture`); the writer fills ``meta``."""

    dest: Path
    meta: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class EvictOp(Op):
    """Move least-recently-used values from the cache to RocksDB until under the limit."""


@dataclass(slots=True, eq=False)
class PopulateOp(Op):
    """Put a value read from RocksDB back into the cache (if the item is unchanged)."""

    table: Table
    slot: int
    version: int
    value: bytes
