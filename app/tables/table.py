"""A table: named items with their own sampler, remover, capacity and rate limiter.

The table keeps its whole index in memory: key → slot, and per-slot columns (priority,
insertion time, times sampled, value size, version, and whether the value is cached,
dirty or on disk). Values sit in :attr:`Table.values` when cached, else in RocksDB.
Only the writer (:class:`rlreplay.workers.task_processor.TaskProcessor`) changes the applied
state; readers merge :attr:`Table.pending` (accepted, not yet applied) over it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from rlreplay.app.selection.base import Selector
from rlreplay.app.selection.rate_limiters import RateGate, RateLimiter
from rlreplay.app.selection.registry import make_selector
from rlreplay.app.tables.config import (
    MinSizeLimiter,
    QueueLimiter,
    RateLimiterSpec,
    SampleToInsertRatioLimiter,
    TableConfig,
)
from rlreplay.app.tables.items import NewItem

PendingEntry = tuple[
    int, NewItem | None, float
]  # (op seq, the item or None for a delete, inserted_at)


@dataclass(slots=True)
class TableCounters:
    """Monotonic counters reported in the table's stats."""

    inserts: int = 0
    samples: int = 0
    deletes: int = 0
    evictions_to_disk: int = 0
    populates: int = 0

    def add(self, other: TableCounters) -> None:
        """Adds ``other``'s counts to these."""
        self.inserts += other.inserts
        self.samples += other.samples
        self.deletes += other.deletes
        self.evictions_to_disk += other.evictions_to_disk
        self.populates += other.populates


#: A table's stats as ``GET /v1/tables/{table}`` names them (``index_bytes`` aside), in the
#: order of :meth:`Table.stat_values`.
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
        size += t.visible
        pending += t.pending_ops
        cached += t.bytes_in_cache
        on_disk += t.bytes_on_disk
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
    return TablesSummary(len(rows), totals, [(t.name, t.stat_values()) for t in chosen])


_SIZE = attrgetter("visible")


def make_rate_limiter(spec: RateLimiterSpec | None) -> RateLimiter:
    """The limiter a table config's ``rate_limiter`` describes.

    None gives a limiter of kind ``"none"`` that behaves as ``min_size`` 1 (Reverb's
    default, ``MinSize(1)``: samples wait while the table is empty); a gate around it
    reports ``limited`` False, so a table may skip the gate and wait for an item itself.
    """
    if spec is None:
        return RateLimiter("none", 1.0, 1, -math.inf, math.inf)
    if isinstance(spec, MinSizeLimiter):
        return RateLimiter("min_size", 1.0, spec.min_size, -math.inf, math.inf)
    if isinstance(spec, SampleToInsertRatioLimiter):
        offset = spec.samples_per_insert * spec.min_size_to_sample
        return RateLimiter(
            "sample_to_insert_ratio",
            spec.samples_per_insert,
            spec.min_size_to_sample,
            offset - spec.error_buffer,
            offset + spec.error_buffer,
        )
    if isinstance(spec, QueueLimiter):
        return RateLimiter("queue", 1.0, 1, 0.0, float(spec.size))
    raise ValueError(f"unknown rate limiter spec {spec!r}")


class Table:
    """One table's in-memory index, selection state and counters."""

    def __init__(self, name: str, tid: int, config: TableConfig) -> None:
        self.name = name
        self.tid = tid
        self.prefix = tid.to_bytes(4, "big")
        self.config = config
        self.sampler: Selector = make_selector(config.sampler.type, config.sampler.params)
        self.remover: Selector | None = (
            make_selector(config.remover.type, {}) if config.max_size is not None else None
        )
        self.index_fields = frozenset(self.sampler.index_fields)
        self.gate = RateGate(make_rate_limiter(config.rate_limiter), size_fn=self.visible_size)
        self.dropped = False
        self.dropping = False  # a drop is accepted: new calls find no table
        self.counters = TableCounters()

        self.index: dict[str, int] = {}
        self.keys: list[str | None] = []
        self.values: list[bytes | None] = []
        self._free: list[int] = []
        cap = 0
        self.priority = np.zeros(cap, dtype=np.float64)
        self.inserted_at = np.zeros(cap, dtype=np.float64)
        self.times_sampled = np.zeros(cap, dtype=np.int64)
        self.size = np.zeros(cap, dtype=np.int64)
        self.version = np.zeros(cap, dtype=np.int64)
        self.referenced = np.zeros(cap, dtype=np.uint8)  # CLOCK bit, set by cache hits
        self.dirty = bytearray()  # value changed since last written to RocksDB
        self.meta_dirty = np.zeros(cap, dtype=np.uint8)  # metadata changed since last written
        self.on_disk = bytearray()  # a copy of the value is in RocksDB
        self.retired = bytearray()  # taken out of selection by its last allowed sample
        self.disk_size = np.zeros(cap, dtype=np.int64)
        self.order = np.zeros(cap, dtype=np.int64)  # insertion order, kept across restarts
        self.put_seq = np.zeros(cap, dtype=np.int64)  # the op (log record) of the value
        self.next_order = 0
        self.fields: dict[int, dict[str, Any]] = {}  # slot → indexed fields (plugin samplers)
        self.bytes_in_cache = 0
        self.bytes_on_disk = 0

        self.pending: dict[str, PendingEntry] = {}
        self.pending_ops = 0  # item ops accepted and not applied
        # What visible_size() answers, kept up to date as ops are accepted (O(1) to read).
        self.visible = 0
        self.accepted_seq = 0
        self.applied_seq = 0
        self._barriers: list[tuple[int, asyncio.Future[None]]] = []
        self._nonempty = asyncio.Event()

    # -- slots (writer side) ------------------------------------------------------------

    def alloc_slot(self, key: str) -> int:
        """A slot for a new key, reusing freed ones first."""
        if self._free:
            slot = self._free.pop()
            self.keys[slot] = key
        else:
            slot = len(self.keys)
            self.keys.append(key)
            self.values.append(None)
            if slot >= len(self.priority):
                self._grow(max(1024, 2 * len(self.priority)))
            self.dirty.append(0)
            self.on_disk.append(0)
            self.retired.append(0)
        self.index[key] = slot
        return slot

    def alloc_slots(self, keys: list[str]) -> list[int]:
        """:meth:`alloc_slot` for many new, distinct keys: their slots, in order."""
        free, n = self._free, len(keys)
        reused = min(n, len(free))
        slots = free[len(free) - reused :]
        slots.reverse()  # the order alloc_slot pops them in
        del free[len(free) - reused :]
        own_keys = self.keys
        for slot, key in zip(slots, keys, strict=False):
            own_keys[slot] = key
        fresh = n - reused
        if fresh:
            start = len(own_keys)
            own_keys.extend(keys[reused:])
            self.values.extend([None] * fresh)
            if start + fresh > len(self.priority):
                self._grow(max(1024, 2 * len(self.priority), start + fresh))
            zeros = bytes(fresh)
            self.dirty.extend(zeros)
            self.on_disk.extend(zeros)
            self.retired.extend(zeros)
            slots.extend(range(start, start + fresh))
        self.index.update(zip(keys, slots, strict=True))
        return slots

    def _grow(self, cap: int) -> None:
        for name in (
            "priority",
            "inserted_at",
            "times_sampled",
            "size",
            "version",
            "disk_size",
            "referenced",
            "meta_dirty",
            "order",
            "put_seq",
        ):
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def free_slots(self, slots: np.ndarray, slot_list: list[int], keys: list[str]) -> None:
        """Forget the keys at distinct ``slots`` (the same as ``slot_list``), which hold
        ``keys``; their columns are reset here, their slots reused by the next keys."""
        index, own_keys, values = self.index, self.keys, self.values
        for key in keys:
            del index[key]
        for slot in slot_list:
            own_keys[slot] = None
            values[slot] = None
        self.referenced[slots] = 0
        self.meta_dirty[slots] = 0
        self.disk_size[slots] = 0
        for flags in (self.dirty, self.on_disk, self.retired):
            with memoryview(flags) as view:  # released at once: the bytearray must grow
                np.frombuffer(view, np.uint8)[slots] = 0
        if self.fields:
            for slot in slot_list:
                self.fields.pop(slot, None)
        self._free.extend(slot_list)

    # -- barrier between accepted and applied ---------------------------------------------

    def accept(self, seq: int, weight: int) -> None:
        """Note that op ``seq`` touching ``weight`` items was accepted for this table."""
        self.accepted_seq = seq
        self.pending_ops += weight

    def applied(self, seq: int, weight: int) -> None:
        """Note that the writer applied op ``seq``; wakes readers waiting for it."""
        self.applied_seq = seq
        self.pending_ops -= weight
        if self._barriers:
            keep = []
            for target, fut in self._barriers:
                if fut.done():
                    continue
                if target <= seq:
                    fut.set_result(None)
                else:
                    keep.append((target, fut))
            self._barriers = keep
        if self.index:
            self._nonempty.set()
        else:
            self._nonempty.clear()

    async def caught_up(self, timeout_s: float | None = None) -> bool:
        """Wait until every op accepted for this table before the call is applied; False
        if that takes more than ``timeout_s``."""
        target = self.accepted_seq
        if self.applied_seq >= target:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._barriers.append((target, fut))
        if timeout_s is None:
            await fut
            return True
        try:
            await asyncio.wait_for(asyncio.shield(fut), max(0.0, timeout_s))
        except TimeoutError:
            fut.cancel()  # applied() and rebuild_pending() skip it
            return False
        return True

    def rebuild_pending(self, ops: Iterable[Any], applying: Any = None) -> None:
        """Recompute what readers see from the ops accepted for this table and not applied
        yet, in order (``applying``: the one the writer is applying, whose pending entries
        it has taken): after refused ops were taken out of the writer's queue. ``ops`` are
        the table's pushes, deletes and priority updates only."""
        pending: dict[str, PendingEntry] = {}
        weight, last = 0, self.applied_seq
        for op in [applying, *ops] if applying is not None else ops:
            weight += op.weight
            last = max(last, op.seq)
            if op is applying:
                continue
            items = getattr(op, "items", None)
            if items is not None:  # a push
                for it in items:
                    pending[it.key] = (op.seq, it, op.inserted_at)
            elif not hasattr(op, "priorities"):  # a delete; priorities have no entries
                for key in op.keys:
                    pending[key] = (op.seq, None, 0.0)
        self.pending.clear()
        self.pending.update(pending)
        self.pending_ops = weight
        self.accepted_seq = last
        index, visible = self.index, len(self.index)
        for key, entry in pending.items():
            if entry[1] is None:
                visible -= key in index
            else:
                visible += key not in index
        self.visible = visible
        self.applied(self.applied_seq, 0)  # readers waiting for a refused op wake up
        if self._barriers:  # those waiting past the last op left: wait for that one
            self._barriers = [(min(t, last), f) for t, f in self._barriers if not f.done()]
            self.applied(self.applied_seq, 0)
        self.gate.notify()

    def fail_waiters(self, exc: BaseException) -> None:
        """The writer stopped: fail every reader waiting on it."""
        for _, fut in self._barriers:
            if not fut.done():
                fut.set_exception(exc)
        self._barriers = []

    async def wait_nonempty(self, timeout_s: float) -> bool:
        """Wait until the applied state holds an item; False on timeout."""
        if self.index:
            return True
        try:
            await asyncio.wait_for(self._nonempty.wait(), timeout_s)
        except TimeoutError:
            return False
        return bool(self.index)

    # -- read side ------------------------------------------------------------------------

    def visible_size(self) -> int:
        """Items a reader sees now: the applied ones with the pending ops merged in."""
        return self.visible

    def contains(self, key: str) -> bool:
        """Whether a reader sees ``key`` now."""
        entry = self.pending.get(key)
        if entry is not None:
            return entry[1] is not None
        return key in self.index

    def count_unseen(self, keys: Iterable[str]) -> int:
        """How many of ``keys`` a reader does not see now: :meth:`contains` for a batch,
        without a method call per key (it runs per pushed item)."""
        keys = list(keys)
        entries = list(map(self.pending.get, keys))
        if not any(entries):  # none pending (entries are tuples): the index decides
            return len(keys) - sum(map(self.index.__contains__, keys))
        index, unseen = self.index, 0
        for key, entry in zip(keys, entries, strict=True):
            if entry[1] is None if entry is not None else key not in index:
                unseen += 1
        return unseen

    def describe(self) -> dict[str, Any]:
        """Config and stats as the contract's ``GET /v1/tables/{table}`` answers them."""
        stats: dict[str, int] = dict(zip(STAT_NAMES, self.stat_values(), strict=True))
        stats["index_bytes"] = self.index_bytes()
        return {"name": self.name, "config": self.config.to_wire(), "stats": stats}

    def stat_values(self) -> tuple[int, ...]:
        """The stats named by :data:`STAT_NAMES`, in that order (cheap: no index walk)."""
        c = self.counters
        return (
            self.visible,
            self.pending_ops,
            self.bytes_in_cache,
            self.bytes_on_disk,
            c.inserts,
            c.samples,
            c.deletes,
            c.evictions_to_disk,
            c.populates,
        )

    def index_bytes(self) -> int:
        """Approximate bytes of the in-memory index (columns, slot lists, sampler state)."""
        cols = sum(
            a.nbytes
            for a in (self.priority, self.inserted_at, self.times_sampled, self.size, self.version)
        )
        lists = 8 * (len(self.keys) + len(self.values)) + 5 * len(self.dirty)
        dict_bytes = 100 * len(self.index)  # dict entry + key string, measured in bench
        sel = self.sampler.index_bytes() + (self.remover.index_bytes() if self.remover else 0)
        return cols + lists + dict_bytes + sel
