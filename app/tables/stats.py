"""A table's counters and stats, and every table's stats summed for ``/metrics``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlreplay.app.tables.table import Table


@dataclass(slots=True)
class TableCounters:
    """Monotonic counters reported in the table's stats."""

    inserts: int = 0
    samples: int = 0
    deletes: int = 0
    evictions_to_disk: int = 0
    populates: int = 0

    def state_dict(self) -> dict[str, int]:
        """The counters, for a checkpoint."""
        return {
            "inserts": self.inserts,
            "samples": self.samples,
            "deletes": self.deletes,
            "evictions_to_disk": self.evictions_to_disk,
            "populates": self.populates,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restores the counters of :meth:`state_dict`."""
        for name, value in state.items():
            if name in self.__slots__:
                setattr(self, name, int(value))

    def add(self, other: TableCounters) -> None:
        """Adds ``other``'s counts to these."""
        self.inserts += other.inserts
        self.samples += other.samples
        self.deletes += other.deletes
        self.evictions_to_disk += other.evictions_to_disk
        self.populates += other.populates


#: A table's stats as ``GET /v1/tables/{table}`` names them (``index_bytes`` aside), in the
#: order of :func:`stat_values`.
STAT_NAMES = (
    "size",
    "pending_ops",
    "bytes_in_cache",
    "bytes_on_disk",
    "inserts",
    "samples",
    "deletes",
    "evictions_to_disk",
    "populates",
)


def describe(t: Table) -> dict[str, Any]:
    """Config and stats of ``t`` as the contract's ``GET /v1/tables/{table}`` answers them."""
    stats: dict[str, float] = dict(zip(STAT_NAMES, stat_values(t), strict=True))
    stats["index_bytes"] = index_bytes(t)
    # what a client spreading the table over servers splits a sample's batch by
    stats["selectable"] = len(t.sampler)
    stats["draw_mass"] = t.sampler.draw_mass()
    stats["expired"] = t.rollouts.expired  # unconsumed items past the table's ttl_s
    e = t.episodes
    if e is not None:  # an episode table: its size counts steps; its cache, held chunks
        stats.update(
            size=e.accepted_steps,
            episodes=e.episodes,
            steps=e.steps,
            stored_bytes=e.stored_bytes,
            bytes_in_cache=e.residency.held_bytes,
        )
    return {"name": t.name, "config": t.config.to_wire(), "stats": stats}


def stat_values(t: Table) -> tuple[int, ...]:
    """The stats of ``t`` named by :data:`STAT_NAMES`, in that order (cheap: no index walk)."""
    c = t.counters
    return (
        t.pending.visible_size(),
        t.pending.ops,
        t.bytes_in_cache,
        t.bytes_on_disk,
        c.inserts,
        c.samples,
        c.deletes,
        c.evictions_to_disk,
        c.populates,
    )


def index_bytes(t: Table) -> int:
    """Approximate bytes of the in-memory index of ``t`` (columns, slot lists, sampler
    state)."""
    cols = sum(a.nbytes for a in (t.priority, t.inserted_at, t.times_sampled, t.size, t.version))
    lists = 8 * (len(t.keys) + len(t.values)) + 5 * len(t.dirty)
    dict_bytes = 100 * len(t.index)  # dict entry + key string, measured in bench
    sel = t.sampler.index_bytes() + (t.remover.index_bytes() if t.remover else 0)
    return cols + lists + dict_bytes + sel


@dataclass(slots=True)
class TablesSummary:
    """Every table's stats summed, and the stats of some tables one by one.

    Attributes:
        tables: How many tables there are.
        totals: The sum over every table of each stat of :data:`STAT_NAMES`, in that order;
            the counters include those of the tables dropped since start.
        largest: ``(name, stat values)`` of the tables asked for, the largest first (equal
            sizes in the tables' order).
    """

    tables: int
    totals: tuple[int, ...]
    largest: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)


def summarize_tables(
    tables: Iterable[Table], *, dropped: TableCounters, largest: int | None
) -> TablesSummary:
    """The :class:`TablesSummary` of ``tables``: one pass of attribute reads, no per-table call.

    Args:
        tables: The tables.
        dropped: The counters of the tables dropped so far, added to the totals so that the
            summed counters never go down.
        largest: How many tables to list one by one, the largest (most items) first; every
            table when None.

    Returns:
        The summary.
    """
    rows = list(tables)
    size = pending = cached = on_disk = 0
    inserts, samples, deletes = dropped.inserts, dropped.samples, dropped.deletes
    evictions, populates = dropped.evictions_to_disk, dropped.populates
    for t in rows:  # inline sums: a method call per table costs several times as much
        size += t._pending._visible
        pending += t._pending._ops
        cached += t._bytes_in_cache
        on_disk += t._bytes_on_disk
        c = t.counters
        inserts += c.inserts
        samples += c.samples
        deletes += c.deletes
        evictions += c.evictions_to_disk
        populates += c.populates
    totals = (size, pending, cached, on_disk, inserts, samples, deletes, evictions, populates)
    # A stable sort on the size alone (equal sizes keep the tables' order): cheaper than a
    # heap or a (size, name) key, which call Python per table.
    chosen = sorted(rows, key=_SIZE, reverse=True)[:largest]
    return TablesSummary(len(rows), totals, [(t.name, stat_values(t)) for t in chosen])


_SIZE = attrgetter("_pending._visible")
