"""A table: named items with their own sampler, remover, capacity and rate limiter.

The table keeps its whole index in memory: key → slot, and per-slot columns (priority,
insertion time, times sampled, value size, version, and whether the value is cached,
dirty or on disk). Values sit in :attr:`Table.values` when cached, else in RocksDB.

Who may change a table, and when (everything runs on the event loop's thread, so no two
of these interleave inside a method):

* The writer (:class:`rlreplay.workers.task_processor.TaskProcessor`) applies ops in log
  order: it assigns and frees slots and their columns, sets priorities, trims, and moves
  values between the cache and RocksDB. It is the only code that changes which keys exist.
* The engine's admission (on accepting a push, delete or priority update) records the op
  in :attr:`Table.pending`, :attr:`Table.visible` and the accepted sequence number, which
  readers merge over the applied state; the writer takes those entries out as it applies.
* A sample, once every op accepted before it is applied, draws with
  :func:`~rlreplay.app.tables.draws.draw`: that counts ``times_sampled`` and takes items
  used up by ``max_times_sampled`` out of selection (``retired``); their deletes then go
  through the writer like any other. :func:`~rlreplay.app.tables.draws.undraw` takes a
  draw back when its answer is refused.
* Cache hits set the CLOCK bit (:attr:`Table.referenced`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from rlreplay.app.selection.base import Selector
from rlreplay.app.selection.rate_limiters import RateGate
from rlreplay.app.selection.registry import make_selector
from rlreplay.app.storage.layout import table_id
from rlreplay.app.tables.changes import ChangeFeed
from rlreplay.app.tables.config import TableConfig, make_rate_limiter
from rlreplay.app.tables.items import NewItem
from rlreplay.app.tables.rollouts import NO_VERSION, Rollouts
from rlreplay.app.tables.stats import STAT_NAMES, TableCounters

PendingEntry = tuple[
    int, NewItem | None, float
]  # (op seq, the item or None for a delete, inserted_at)


class Table:
    """One table's in-memory index, selection state and counters."""

    def __init__(self, name: str, tid: int, config: TableConfig) -> None:
        self.name = name
        self.tid = tid
        self.prefix = table_id(tid)  # its items' keys in RocksDB start with it
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
        #: The change feed, started by the first follower (see :meth:`follow`).
        self.changes: ChangeFeed | None = None

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
        # rollout tables: the policy version (NO_VERSION: none), the bits of the fields the
        # value has and of the tasks that acknowledged it: those of the first 64 names (see
        # rollouts.py and name_masks.py)
        self.policy_version = np.zeros(cap, dtype=np.int64)
        self.field_mask = np.zeros(cap, dtype=np.uint64)
        self.acked_mask = np.zeros(cap, dtype=np.uint64)
        self.rollouts = Rollouts(self)
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
        deque(map(own_keys.__setitem__, slots, keys), maxlen=0)  # reused slots, in C
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
            "policy_version",
            "field_mask",
            "acked_mask",
        ):
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def free_slots(self, slots: np.ndarray, slot_list: list[int], keys: list[str]) -> None:
        """Forget the keys at distinct ``slots`` (the same as ``slot_list``), which hold
        ``keys``; their columns are reset here, their slots reused by the next keys."""
        self.rollouts.on_free(slots, slot_list)
        index, own_keys, values = self.index, self.keys, self.values
        if self.changes is not None:
            self.changes.delete(keys)
        nones = itertools.repeat(None)  # below: loops in C, not one Python step per key
        deque(map(index.__delitem__, keys), maxlen=0)
        deque(map(own_keys.__setitem__, slot_list, nones), maxlen=0)
        deque(map(values.__setitem__, slot_list, nones), maxlen=0)
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

    # -- persistence ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The table's own state beyond its items: its id, config, the rate limiter's
        counts and the stats' counters (each item's columns are saved with the item)."""
        return {
            "id": self.tid,
            "config": self.config.to_wire(),
            "limiter": self.gate.limiter.state_dict(),
            "counters": self.counters.state_dict(),
            "rollouts": self.rollouts.state_dict(),
        }

    @classmethod
    def from_state_dict(cls, name: str, state: dict[str, Any]) -> Table:
        """The (empty) table a :meth:`state_dict` describes; its items are restored apart."""
        table = cls(name, int(state["id"]), TableConfig.model_validate(state["config"]))
        table.load_state_dict(state)
        return table

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the counts of :meth:`state_dict` (a state saved before they were kept
        leaves them at zero)."""
        if "limiter" in state:
            self.gate.limiter.load_state_dict(state["limiter"])
        if "counters" in state:
            self.counters.load_state_dict(state["counters"])
        if "rollouts" in state:
            self.rollouts.load_state_dict(state["rollouts"])

    # -- operations (the writer's, and a sample's draw) -----------------------------------

    def assign(
        self,
        slots: np.ndarray,
        slot_list: list[int],
        priorities: np.ndarray,
        sizes: np.ndarray,
        inserted_at: float | np.ndarray,
        seq: int | np.ndarray,
        fields: list[dict[str, Any]] | None,
        replaced: list[int],
    ) -> None:
        """Give the (new or replaced) items at ``slots`` their columns; ``replaced`` are
        those of the slots that were in selection before, taken out of it here."""
        if replaced:
            gone = np.array(replaced, dtype=np.int64)
            self.sampler.remove(gone)
            if self.remover is not None:
                self.remover.remove(gone)
        self.priority[slots] = priorities
        self.inserted_at[slots] = inserted_at
        self.times_sampled[slots] = 0
        self.size[slots] = sizes
        self.version[slots] += 1
        self.referenced[slots] = 0
        self.order[slots] = np.arange(self.next_order, self.next_order + len(slots))
        self.put_seq[slots] = seq
        self.next_order += len(slots)
        if fields is not None:
            self.fields.update(zip(slot_list, fields, strict=True))
        with memoryview(self.retired) as flags:  # released at once: the bytearray must grow
            np.frombuffer(flags, np.uint8)[slots] = 0

    def select(
        self,
        slots: np.ndarray,
        priorities: np.ndarray,
        inserted_at: float | np.ndarray,
        fields: list[dict[str, Any]] | None,
    ) -> None:
        """Put items :meth:`assign` gave columns in selection, once their values can be
        read (the writer calls it after storing them)."""
        times = np.full(len(slots), inserted_at)
        self.sampler.insert(slots, priorities, times, fields)
        if self.remover is not None:
            self.remover.insert(slots, priorities, times, fields)
        self.counters.inserts += len(slots)
        if self.changes is not None:  # a batch per time: each joined push has its own
            keys, ends = self.keys, [len(slots)] if len(slots) else []
            if isinstance(inserted_at, np.ndarray) and ends:
                ends = [*(np.flatnonzero(np.diff(inserted_at)) + 1).tolist(), len(slots)]
            start = 0
            for end in ends:
                part = [keys[s] or "" for s in slots[start:end].tolist()]
                self.changes.put(part, priorities[start:end], times[start])
                start = end

    def unselect(self, slots: np.ndarray, *, remover: bool) -> None:
        """Take ``slots`` out of selection (the sampler, and the remover if ``remover``),
        those not out already, and mark them all retired."""
        with memoryview(self.retired) as flags:  # released at once: the bytearray must grow
            retired = np.frombuffer(flags, np.uint8)
            live = slots[retired[slots] == 0]
            retired[slots] = 1
            del retired
        if len(live):
            self.sampler.remove(live)
            if remover and self.remover is not None:
                self.remover.remove(live)

    def excess(self, rng: np.random.Generator) -> np.ndarray:
        """The slots the remover gives up to bring the table within ``max_size`` (already
        out of the remover; :meth:`unselect` takes them out of the sampler)."""
        max_size = self.config.max_size
        if max_size is None or self.remover is None or len(self.index) <= max_size:
            return np.empty(0, dtype=np.int64)
        return self.remover.evict(min(len(self.index) - max_size, len(self.remover)), rng)

    def set_priorities(self, keys: Sequence[str], priorities: Sequence[float]) -> None:
        """New priorities for the items of ``keys`` that exist (the others are skipped)."""
        slots, prios = [], []
        index_get, retired = self.index.get, self.retired
        for key, prio in zip(keys, priorities, strict=True):
            slot = index_get(key)
            if slot is None:
                continue
            self.priority[slot] = prio
            self.meta_dirty[slot] = 1
            if not retired[slot]:
                slots.append(slot)
                prios.append(prio)
        if slots:
            sa, pa = np.asarray(slots, dtype=np.int64), np.asarray(prios, dtype=np.float64)
            self.sampler.update(sa, pa)
            if self.remover is not None:
                self.remover.update(sa, pa)
        if self.changes is not None:
            held = [(k, p) for k, p in zip(keys, priorities, strict=True) if k in self.index]
            self.changes.priority([k for k, _ in held], [p for _, p in held])

    def restore(
        self, rows: list[tuple[Any, ...]], *, on_disk: bool, fields: list[dict[str, Any]]
    ) -> tuple[list[int], list[int]]:
        """Load recovered items (key, value or None, priority, inserted_at, times_sampled,
        size, order, and optionally their rollout metadata or None), handing them to the
        selectors in their original insertion order.

        Returns:
            The slots whose values are now cached, and their sizes (for the cache ledger).
        """
        if not rows:
            return [], []
        by_order = sorted(range(len(rows)), key=lambda i: rows[i][6])
        rows = [rows[i] for i in by_order]
        if fields:
            fields = [fields[i] for i in by_order]
        slots = np.empty(len(rows), dtype=np.int64)
        cached: list[int] = []
        sizes: list[int] = []
        rollouts = self.rollouts
        for i, (key, value, prio, ts, sampled, size, order, *more) in enumerate(rows):
            slot = self.alloc_slot(key)
            self.policy_version[slot] = NO_VERSION
            if more and more[0] is not None:
                rollouts.restore(slot, more[0])
            slots[i] = slot
            self.order[slot] = order
            self.priority[slot] = prio
            self.inserted_at[slot] = ts
            self.times_sampled[slot] = sampled
            self.size[slot] = size
            self.version[slot] += 1
            if on_disk:
                self.on_disk[slot] = 1
                self.disk_size[slot] = size
                self.bytes_on_disk += size
            else:
                self.values[slot] = value
                self.dirty[slot] = 1
                cached.append(slot)
                sizes.append(size)
                self.bytes_in_cache += size
        self.next_order = int(self.order[slots].max()) + 1
        given = fields if self.index_fields else None
        if given is not None:
            self.fields.update(zip(slots.tolist(), given, strict=True))
        self.sampler.insert(slots, self.priority[slots], self.inserted_at[slots], given)
        if self.remover is not None:
            self.remover.insert(slots, self.priority[slots], self.inserted_at[slots], given)
        return cached, sizes

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
        the table's item ops only (pushes, patches, deletes, priorities, acks, versions)."""
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
            elif getattr(op, "deletes", False):  # other ops have no entries
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
        if self.changes is not None:
            self.changes.close()
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

    def follow(self, keep: int) -> ChangeFeed:
        """The table's change feed, started now (holding ``keep`` events) if it has none."""
        if self.changes is None:
            self.changes = ChangeFeed(keep)
        return self.changes

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
        stats: dict[str, float] = dict(zip(STAT_NAMES, self.stat_values(), strict=True))
        stats["index_bytes"] = self.index_bytes()
        # what a client spreading the table over servers splits a sample's batch by
        stats["selectable"] = len(self.sampler)
        stats["draw_mass"] = self.sampler.draw_mass()
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
