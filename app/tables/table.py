"""A table: named items with their own sampler, remover, capacity and rate limiter.

The table keeps its whole index in memory: key → slot, and per-slot columns (priority,
insertion time, times sampled, value size, version, and whether the value is cached,
dirty or on disk). Values sit in :attr:`Table.values` when cached, else in RocksDB.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np

from rlreplay.app.episodes.episode_table import EpisodeTable
from rlreplay.app.selection.base import Selector
from rlreplay.app.selection.rate_limiters import RateGate
from rlreplay.app.selection.registry import make_selector
from rlreplay.app.storage.layout import table_id
from rlreplay.app.tables import draws, filtered_draws, residency
from rlreplay.app.tables.changes import ChangeFeed
from rlreplay.app.tables.config import TableConfig, make_rate_limiter
from rlreplay.app.tables.draws import Draw
from rlreplay.app.tables.pending import PendingOps
from rlreplay.app.tables.restore import restore_items
from rlreplay.app.tables.rollouts import Rollouts
from rlreplay.app.tables.stats import TableCounters
from rlreplay.app.tables.waits import end_waits
from rlreplay.wire.errors import ReplayError


class Table:
    """One table's in-memory index, selection state and counters.

    The columns are private: other modules read them through the read-only properties
    below and change them only through this class's methods (``tests/test_table_owns_writes.py``
    fails on an assignment to them from outside ``app/tables``). The ops accepted and not
    applied yet are a part of their own, :attr:`pending` (a
    :class:`~rlreplay.app.tables.pending.PendingOps`, which says who calls what of it).
    Everything runs on the event loop's thread, so no two of these calls interleave inside
    a method. Who may call what, from where:

    * The writer (``TaskProcessor`` and its ``OpApplier``, and recovery replaying the
      log), in log order: keys and storage. :meth:`alloc_slots`, :meth:`assign`,
      :meth:`select`, :meth:`take_excess`, :meth:`free_slots`, :meth:`set_priorities`,
      :meth:`patch_value`, :meth:`restore`, where a value lives (:meth:`hold_values`,
      :meth:`mark_written`, :meth:`populate`, :meth:`evict`, :meth:`mark_checkpointed`),
      :meth:`rebuild_pending`, :meth:`mark_dropped`. Only it changes which keys exist.
    * The engine, in the caller's task: :meth:`mark_dropping` while a drop is accepted
      and not applied.
    * A sample, in the caller's task, once every op accepted before it is applied:
      :meth:`draw` counts ``times_sampled`` and takes items used up by
      ``max_times_sampled`` out of selection (``retired``; their deletes then go through
      the writer like any other); :meth:`undraw` takes a draw back when its answer is
      refused.
    * Any reader: :meth:`touch` sets the CLOCK bit of cache hits, :meth:`mark_meta_dirty`
      marks an item's metadata for the next checkpoint; the cache ledger clears the bit
      (:meth:`clear_referenced`).
    """

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
        self._dropped = False
        self._dropping = False  # a drop is accepted: new calls find no table
        self.counters = TableCounters()
        #: The change feed, started by the first follower (see :meth:`follow`).
        self.changes: ChangeFeed | None = None
        #: An episode table's episodes and steps (None: a table of items).
        self.episodes = EpisodeTable(**config.episodes.model_dump()) if config.episodes else None

        self._index: dict[str, int] = {}
        self._pending = PendingOps(self._index)
        self._keys: list[str | None] = []
        self._values: list[bytes | None] = []
        self._free: list[int] = []
        cap = 0
        self._priority = np.zeros(cap, dtype=np.float64)
        self._inserted_at = np.zeros(cap, dtype=np.float64)
        self._times_sampled = np.zeros(cap, dtype=np.int64)
        self._size = np.zeros(cap, dtype=np.int64)
        self._version = np.zeros(cap, dtype=np.int64)
        self._referenced = np.zeros(cap, dtype=np.uint8)  # CLOCK bit, set by cache hits
        self._dirty = bytearray()  # value changed since last written to RocksDB
        self._meta_dirty = np.zeros(cap, dtype=np.uint8)  # metadata changed since last written
        self._on_disk = bytearray()  # a copy of the value is in RocksDB
        self._retired = bytearray()  # taken out of selection by its last allowed sample
        self._disk_size = np.zeros(cap, dtype=np.int64)
        self._order = np.zeros(cap, dtype=np.int64)  # insertion order, kept across restarts
        self._put_seq = np.zeros(cap, dtype=np.int64)  # the op (log record) of the value
        self._next_order = 0
        self._fields: dict[int, dict[str, Any]] = {}  # slot → indexed fields (plugin samplers)
        # rollout tables: the policy version (NO_VERSION: none), the bits of the fields the
        # value has and of the tasks that acknowledged it: those of the first 64 names (see
        # rollouts.py and name_masks.py)
        self._policy_version = np.zeros(cap, dtype=np.int64)
        self._field_mask = np.zeros(cap, dtype=np.uint64)
        self._acked_mask = np.zeros(cap, dtype=np.uint64)
        self.rollouts = Rollouts(self)
        self._bytes_in_cache = 0
        self._bytes_on_disk = 0

    # -- columns, read-only (change them through the methods) -----------------------------
    @property
    def index(self) -> dict[str, int]:
        """Key → slot of the applied items."""
        return self._index

    @property
    def keys(self) -> list[str | None]:
        """Each slot's key (None: free)."""
        return self._keys

    @property
    def values(self) -> list[bytes | None]:
        """Each slot's cached value (None: in RocksDB, or free)."""
        return self._values

    @property
    def priority(self) -> np.ndarray:
        return self._priority

    @property
    def inserted_at(self) -> np.ndarray:
        return self._inserted_at

    @property
    def times_sampled(self) -> np.ndarray:
        return self._times_sampled

    @property
    def size(self) -> np.ndarray:
        """Each value's size with its key."""
        return self._size

    @property
    def version(self) -> np.ndarray:
        """Moves on with each new value of a slot."""
        return self._version

    @property
    def referenced(self) -> np.ndarray:
        """The CLOCK bit, set by cache hits."""
        return self._referenced

    @property
    def dirty(self) -> bytearray:
        """The value changed since last written to RocksDB."""
        return self._dirty

    @property
    def meta_dirty(self) -> np.ndarray:
        """The metadata changed since last written."""
        return self._meta_dirty

    @property
    def on_disk(self) -> bytearray:
        """A copy of the value is in RocksDB."""
        return self._on_disk

    @property
    def retired(self) -> bytearray:
        """Taken out of selection by its last allowed sample."""
        return self._retired

    @property
    def disk_size(self) -> np.ndarray:
        return self._disk_size

    @property
    def order(self) -> np.ndarray:
        """Insertion order, kept across restarts."""
        return self._order

    @property
    def put_seq(self) -> np.ndarray:
        """The op (log record) of the value."""
        return self._put_seq

    @property
    def next_order(self) -> int:
        return self._next_order

    @property
    def fields(self) -> dict[int, dict[str, Any]]:
        """Slot → indexed fields (plugin samplers)."""
        return self._fields

    @property
    def policy_version(self) -> np.ndarray:
        return self._policy_version

    @property
    def field_mask(self) -> np.ndarray:
        return self._field_mask

    @property
    def acked_mask(self) -> np.ndarray:
        return self._acked_mask

    @property
    def bytes_in_cache(self) -> int:
        return self._bytes_in_cache

    @property
    def bytes_on_disk(self) -> int:
        return self._bytes_on_disk

    @property
    def pending(self) -> PendingOps:
        """The ops accepted and not applied yet, as readers see them."""
        return self._pending

    @property
    def dropped(self) -> bool:
        """The drop is applied."""
        return self._dropped

    @property
    def dropping(self) -> bool:
        """A drop is accepted: new calls find no table."""
        return self._dropping

    # -- slots (writer side) ------------------------------------------------------------

    def alloc_slot(self, key: str) -> int:
        """A slot for a new key, reusing freed ones first."""
        if self._free:
            slot = self._free.pop()
            self._keys[slot] = key
        else:
            slot = len(self._keys)
            self._keys.append(key)
            self._values.append(None)
            if slot >= len(self._priority):
                self._grow(max(1024, 2 * len(self._priority)))
            self._dirty.append(0)
            self._on_disk.append(0)
            self._retired.append(0)
        self._index[key] = slot
        return slot

    def alloc_slots(self, keys: list[str]) -> list[int]:
        """:meth:`alloc_slot` for many new, distinct keys: their slots, in order."""
        free, n = self._free, len(keys)
        reused = min(n, len(free))
        slots = free[len(free) - reused :]
        slots.reverse()  # the order alloc_slot pops them in
        del free[len(free) - reused :]
        own_keys = self._keys
        deque(map(own_keys.__setitem__, slots, keys), maxlen=0)  # reused slots, in C
        fresh = n - reused
        if fresh:
            start = len(own_keys)
            own_keys.extend(keys[reused:])
            self._values.extend([None] * fresh)
            if start + fresh > len(self._priority):
                self._grow(max(1024, 2 * len(self._priority), start + fresh))
            zeros = bytes(fresh)
            self._dirty.extend(zeros)
            self._on_disk.extend(zeros)
            self._retired.extend(zeros)
            slots.extend(range(start, start + fresh))
        self._index.update(zip(keys, slots, strict=True))
        return slots

    def _grow(self, cap: int) -> None:
        for name in (
            "_priority",
            "_inserted_at",
            "_times_sampled",
            "_size",
            "_version",
            "_disk_size",
            "_referenced",
            "_meta_dirty",
            "_order",
            "_put_seq",
            "_policy_version",
            "_field_mask",
            "_acked_mask",
        ):
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def free_slots(self, slots: np.ndarray, slot_list: list[int], keys: list[str]) -> np.ndarray:
        """Forget the keys at distinct, unselected ``slots`` (the same as ``slot_list``),
        which hold ``keys``: their columns are reset and their bytes uncounted here, their
        slots reused by the next keys.

        Returns:
            The positions in ``keys`` of the items whose values RocksDB holds (deleting
            their records is the caller's).
        """
        values = self._values
        cached = [slot for slot in slot_list if values[slot] is not None]
        if cached:
            sizes = self._size[slots] if len(cached) == len(slot_list) else self._size[cached]
            self._bytes_in_cache -= int(sizes.sum())
        with memoryview(self._on_disk) as view:
            on_disk = np.flatnonzero(np.frombuffer(view, np.uint8)[slots])
        if len(on_disk):
            self._bytes_on_disk -= int(self._disk_size[slots[on_disk]].sum())
        self.rollouts.on_free(slots, slot_list)
        index, own_keys = self._index, self._keys
        if self.changes is not None:
            self.changes.delete(keys)
        nones = itertools.repeat(None)  # below: loops in C, not one Python step per key
        deque(map(index.__delitem__, keys), maxlen=0)
        deque(map(own_keys.__setitem__, slot_list, nones), maxlen=0)
        deque(map(values.__setitem__, slot_list, nones), maxlen=0)
        self._referenced[slots] = 0
        self._meta_dirty[slots] = 0
        self._disk_size[slots] = 0
        for flags in (self._dirty, self._on_disk, self._retired):
            with memoryview(flags) as view:  # released at once: the bytearray must grow
                np.frombuffer(view, np.uint8)[slots] = 0
        if self._fields:
            for slot in slot_list:
                self._fields.pop(slot, None)
        self._free.extend(slot_list)
        self.counters.deletes += len(slot_list)
        return on_disk

    def take_excess(self, rng: np.random.Generator) -> tuple[np.ndarray, list[int], list[str]]:
        """The items the remover gives up to bring the table within ``max_size``, taken out
        of selection and of what readers see: their slots (as an array and a list) and
        keys, for :meth:`free_slots`."""
        slots = self.excess(rng)
        if not len(slots):
            return slots, [], []
        self.unselect(slots, remover=False)  # the remover dropped them already
        slot_list = slots.tolist()
        keys = cast(list[str], list(map(self._keys.__getitem__, slot_list)))  # held slots
        self._pending.forget_applied(keys)
        return slots, slot_list, keys

    # -- where values live (the writer's; see residency.py) ------------------------------

    def forget_cached(self, slots: np.ndarray) -> None:
        """The cached values at ``slots`` are being replaced (see :mod:`.residency`)."""
        residency.forget_cached(self, slots)

    def hold_values(
        self,
        slots: np.ndarray,
        slot_list: list[int],
        values: list[bytes],
        sizes: np.ndarray,
        replaced_cached: np.ndarray | None,
    ) -> None:
        """Keep pushed ``values`` at ``slots`` in the cache, dirty."""
        residency.hold_values(self, slots, slot_list, values, sizes, replaced_cached)

    def mark_written(self, slots: np.ndarray, slot_list: list[int], sizes: list[int]) -> None:
        """The values at ``slots`` were written through to RocksDB: none is cached."""
        residency.mark_written(self, slots, slot_list, sizes)

    def populate(self, slot: int, value: bytes, version: int) -> int | None:
        """Cache ``value``, read from RocksDB for ``slot`` at ``version``, if still current."""
        return residency.populate(self, slot, value, version)

    def evict(self, slot: int) -> int:
        """The value at ``slot`` is in RocksDB now: it leaves the cache. Returns its size."""
        return residency.evict(self, slot)

    def mark_checkpointed(self, slots: np.ndarray, wrote: np.ndarray) -> None:
        """A checkpoint's batch holds the items at ``slots`` (their values where ``wrote``)."""
        residency.mark_checkpointed(self, slots, wrote)

    def unmark_checkpointed(self, slot: int, *, wrote: bool, on_disk: int, disk_size: int) -> None:
        """A checkpoint's batch failed: the item at ``slot`` is to write again."""
        residency.unmark_checkpointed(self, slot, wrote=wrote, on_disk=on_disk, disk_size=disk_size)

    def patch_value(self, slot: int, value: bytes, size: int) -> None:
        """A patch's new ``value`` for ``slot``, cached and dirty."""
        residency.patch_value(self, slot, value, size)

    def mark_dropped(self) -> bool:
        """The writer applies the table's drop: False if it was dropped already."""
        if self._dropped:
            return False
        self._dropped = True
        return True

    # -- any reader's marks ---------------------------------------------------------------

    def touch(self, slots: np.ndarray | int) -> None:
        """Cache hits at ``slots``: their CLOCK bit is set."""
        self._referenced[slots] = 1

    def clear_referenced(self, slots: np.ndarray) -> None:
        """The cache ledger gave ``slots`` their second chance: their CLOCK bit is cleared."""
        self._referenced[slots] = 0

    def mark_meta_dirty(self, slot: int) -> None:
        """The metadata of the item at ``slot`` changed: the next checkpoint writes it."""
        self._meta_dirty[slot] = 1

    # -- a sample's draws (the caller's task) ---------------------------------------------

    def draw(self, n: int, rng: np.random.Generator) -> Draw:
        """Draw ``n`` picks (see :func:`~rlreplay.app.tables.draws.draw`)."""
        return draws.draw(self, n, rng)

    def draw_among(self, n: int, rng: np.random.Generator, slots: np.ndarray) -> Draw:
        """Draw ``n`` picks among ``slots`` (see :mod:`~rlreplay.app.tables.filtered_draws`)."""
        return filtered_draws.draw_among(self, n, rng, slots)

    def undraw(self, taken: Draw) -> None:
        """Take back a refused draw (see :func:`~rlreplay.app.tables.draws.undraw`)."""
        draws.undraw(self, taken)

    # -- a drop (the engine's, in the caller's task) -------------------------------------

    def mark_dropping(self, dropping: bool = True) -> None:
        """A drop is accepted (``dropping``): new calls find no table until it is applied;
        or it was refused (not ``dropping``)."""
        self._dropping = dropping

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
        self._priority[slots] = priorities
        self._inserted_at[slots] = inserted_at
        self._times_sampled[slots] = 0
        self._size[slots] = sizes
        self._version[slots] += 1
        self._referenced[slots] = 0
        self._order[slots] = np.arange(self._next_order, self._next_order + len(slots))
        self._put_seq[slots] = seq
        self._next_order += len(slots)
        if fields is not None:
            self._fields.update(zip(slot_list, fields, strict=True))
        with memoryview(self._retired) as flags:  # released at once: the bytearray must grow
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
            keys, ends = self._keys, [len(slots)] if len(slots) else []
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
        with memoryview(self._retired) as flags:  # released at once: the bytearray must grow
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
        if max_size is None or self.remover is None or len(self._index) <= max_size:
            return np.empty(0, dtype=np.int64)
        return self.remover.evict(min(len(self._index) - max_size, len(self.remover)), rng)

    def set_priorities(self, keys: Sequence[str], priorities: Sequence[float]) -> None:
        """New priorities for the items of ``keys`` that exist (the others are skipped)."""
        slots, prios = [], []
        index_get, retired = self._index.get, self._retired
        for key, prio in zip(keys, priorities, strict=True):
            slot = index_get(key)
            if slot is None:
                continue
            self._priority[slot] = prio
            self._meta_dirty[slot] = 1
            if not retired[slot]:
                slots.append(slot)
                prios.append(prio)
        if slots:
            sa, pa = np.asarray(slots, dtype=np.int64), np.asarray(prios, dtype=np.float64)
            self.sampler.update(sa, pa)
            if self.remover is not None:
                self.remover.update(sa, pa)
        if self.changes is not None:
            held = [(k, p) for k, p in zip(keys, priorities, strict=True) if k in self._index]
            self.changes.priority([k for k, _ in held], [p for _, p in held])

    def restore(
        self, rows: list[tuple[Any, ...]], *, on_disk: bool, fields: list[dict[str, Any]]
    ) -> tuple[list[int], list[int]]:
        """Load recovered items (see :func:`~rlreplay.app.tables.restore.restore_items`)."""
        return restore_items(self, rows, on_disk=on_disk, fields=fields)

    # -- pending ops (see PendingOps) ----------------------------------------------------

    def rebuild_pending(self, ops: Iterable[Any], applying: Any = None) -> None:
        """Recompute what readers see from the ops not applied yet (see
        :meth:`PendingOps.rebuild`); rate limiter waiters look again."""
        self._pending.rebuild(ops, applying)
        self.gate.notify()

    def fail_waiters(self, exc: ReplayError) -> None:
        """The writer stopped or the table was deleted: close the change feed, fail every
        reader waiting on the writer, and end every other held wait (:func:`end_waits`)."""
        if self.changes is not None:
            self.changes.close()
        self._pending.fail_waiters(exc)
        end_waits(self, exc)

    # -- read side ------------------------------------------------------------------------

    def follow(self, keep: int) -> ChangeFeed:
        """The table's change feed, started now (holding ``keep`` events) if it has none."""
        if self.changes is None:
            self.changes = ChangeFeed(keep)
        return self.changes

    def visible_size(self) -> int:
        """Items a reader sees now (see :meth:`PendingOps.visible_size`); steps, accepted
        ones included, in an episode table."""
        if self.episodes is not None:
            return self.episodes.accepted_steps
        return self._pending.visible_size()
