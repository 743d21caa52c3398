"""A table: named items with their own sampler, remover, capacity and rate limiter.

The table keeps its whole index in memory: key → slot, and per-slot columns (priority,
insertion time, times sampled, value size, version, and whether the value is cached,
dirty or on disk). Values sit in :attr:`Table.values` when cached, else in RocksDB.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from rlreplay.app.selection.base import Selector
from rlreplay.app.selection.rate_limiters import RateGate
from rlreplay.app.selection.registry import make_selector
from rlreplay.app.storage.layout import table_id
from rlreplay.app.tables import draws
from rlreplay.app.tables.changes import ChangeFeed
from rlreplay.app.tables.config import TableConfig, make_rate_limiter
from rlreplay.app.tables.draws import Draw
from rlreplay.app.tables.items import NewItem
from rlreplay.app.tables.rollouts import NO_VERSION, Rollouts
from rlreplay.app.tables.stats import STAT_NAMES, TableCounters

PendingEntry = tuple[
    int, NewItem | None, float
]  # (op seq, the item or None for a delete, inserted_at)


class Table:
    """One table's in-memory index, selection state and counters.

    The columns are private: other modules read them through the read-only properties
    below and change them only through this class's methods (``tests/test_table_owns_writes.py``
    fails on an assignment to them from outside ``app/tables``). Everything runs on the
    event loop's thread, so no two of these calls interleave inside a method. Who may call
    what, from where:

    * The writer (``TaskProcessor`` and its ``OpApplier``, and recovery replaying the
      log), in log order: keys and storage. :meth:`alloc_slots`, :meth:`assign`,
      :meth:`select`, :meth:`settle_pending`, :meth:`take_excess`, :meth:`free_slots`,
      :meth:`set_priorities`, :meth:`patch_value`, :meth:`restore`, where a value lives
      (:meth:`hold_values`, :meth:`mark_written`, :meth:`populate`, :meth:`evict`,
      :meth:`mark_checkpointed`), :meth:`applied`, :meth:`mark_dropped`. Only it changes
      which keys exist.
    * The engine's admission, in the caller's task, on accepting a write:
      :meth:`admit_puts`, :meth:`admit_patches`, :meth:`admit_deletes` record the op in
      the pending entries that readers merge over the applied state (the writer takes them
      out as it applies); :meth:`mark_dropping` while a drop is accepted and not applied.
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

        self._index: dict[str, int] = {}
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

        self._pending: dict[str, PendingEntry] = {}
        self._pending_ops = 0  # item ops accepted and not applied
        # What visible_size() answers, kept up to date as ops are accepted (O(1) to read).
        self._visible = 0
        self._accepted_seq = 0
        self._applied_seq = 0
        self._barriers: list[tuple[int, asyncio.Future[None]]] = []
        self._nonempty = asyncio.Event()

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
    def pending(self) -> dict[str, PendingEntry]:
        """Key → the last accepted, unapplied op on it."""
        return self._pending

    @property
    def pending_ops(self) -> int:
        """Item ops accepted and not applied."""
        return self._pending_ops

    @property
    def accepted_seq(self) -> int:
        return self._accepted_seq

    @property
    def applied_seq(self) -> int:
        return self._applied_seq

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
        # a pending op decides what readers see of a key
        self._visible -= len(keys) - sum(map(self._pending.__contains__, keys))
        return slots, slot_list, keys

    def settle_pending(self, keys: Iterable[str], seqs: Iterable[int]) -> None:
        """The writer applied, for each of ``keys``, the op ``seq`` beside it: its pending
        entry goes, unless a later op's replaced it."""
        pending = self._pending
        get = pending.get
        for key, seq in zip(keys, seqs, strict=False):  # seqs: often itertools.repeat
            entry = get(key)
            if entry is not None and entry[0] == seq:
                del pending[key]

    # -- where values live (the writer's) -------------------------------------------------

    def forget_cached(self, slots: np.ndarray) -> None:
        """The cached values at ``slots`` are being replaced: their bytes are uncounted."""
        self._bytes_in_cache -= int(self._size[slots].sum())

    def hold_values(
        self,
        slots: np.ndarray,
        slot_list: list[int],
        values: list[bytes],
        sizes: np.ndarray,
        replaced_cached: np.ndarray | None,
    ) -> None:
        """Keep pushed ``values`` (``sizes``, with their keys) at ``slots`` in the cache,
        dirty; ``replaced_cached``: the slots whose cached values they replace, which
        count as hits (CLOCK)."""
        self._meta_dirty[slots] = 1
        deque(map(self._values.__setitem__, slot_list, values), maxlen=0)
        # a short-lived view of the flag bytearray (a live view would block its growth)
        np.frombuffer(self._dirty, np.uint8)[slots] = 1
        if replaced_cached is not None:
            self._referenced[replaced_cached] = 1
        self._bytes_in_cache += int(sizes.sum())

    def mark_written(self, slots: np.ndarray, slot_list: list[int], sizes: list[int]) -> None:
        """The values at ``slots`` (``sizes``, with their keys) and their metadata were
        written through to RocksDB: none is cached."""
        self._meta_dirty[slots] = 0
        values, on_disk, dirty, disk_size = (
            self._values,
            self._on_disk,
            self._dirty,
            self._disk_size,
        )
        for slot, size in zip(slot_list, sizes, strict=True):
            values[slot] = None
            on_disk[slot] = 1
            dirty[slot] = 0
            self._bytes_on_disk += size - int(disk_size[slot])
            disk_size[slot] = size

    def populate(self, slot: int, value: bytes, version: int) -> int | None:
        """Cache ``value``, read from RocksDB for ``slot`` at ``version``, unless the slot
        changed since or holds a value already. Returns its size, or None if not taken."""
        if self._dropped or slot >= len(self._keys) or self._keys[slot] is None:
            return None
        if int(self._version[slot]) != version or self._values[slot] is not None:
            return None
        self._values[slot] = value
        self._dirty[slot] = 0
        size = int(self._size[slot])
        self._bytes_in_cache += size
        self.counters.populates += 1
        return size

    def evict(self, slot: int) -> int:
        """The value at ``slot`` and its metadata are in RocksDB now: it leaves the cache.
        Returns its size."""
        size = int(self._size[slot])
        if self._dirty[slot] or not self._on_disk[slot]:
            self._bytes_on_disk += size - int(self._disk_size[slot])
            self._disk_size[slot] = size
        self._on_disk[slot] = 1
        self._values[slot] = None
        self._dirty[slot] = self._meta_dirty[slot] = 0
        self._bytes_in_cache -= size
        self.counters.evictions_to_disk += 1
        return size

    def mark_checkpointed(self, slot: int, *, wrote: bool) -> None:
        """A checkpoint's batch holds the metadata of the item at ``slot``, and its value if
        ``wrote``."""
        if wrote:
            size = int(self._size[slot])
            self._bytes_on_disk += size - int(self._disk_size[slot])
            self._disk_size[slot] = size
            self._on_disk[slot] = 1
            self._dirty[slot] = 0
        self._meta_dirty[slot] = 0

    def unmark_checkpointed(self, slot: int, *, wrote: bool, on_disk: int, disk_size: int) -> None:
        """A checkpoint's batch failed: the item at ``slot`` is to write again, as it was
        before :meth:`mark_checkpointed` (``on_disk``, ``disk_size``: its flags then)."""
        self._meta_dirty[slot] = 1
        if wrote:
            self._bytes_on_disk += disk_size - int(self._disk_size[slot])
            self._dirty[slot], self._on_disk[slot] = 1, on_disk
            self._disk_size[slot] = disk_size

    def patch_value(self, slot: int, value: bytes, size: int) -> None:
        """A patch's new ``value`` for ``slot`` (``size``: with its key), cached and dirty;
        a value read from RocksDB before it is stale (its version moves on)."""
        if self._values[slot] is not None:
            self._bytes_in_cache -= int(self._size[slot])
        self._values[slot] = value
        self._size[slot] = size
        self._bytes_in_cache += size
        self._dirty[slot] = 1
        self._meta_dirty[slot] = 1
        self._version[slot] += 1

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

    def undraw(self, taken: Draw) -> None:
        """Take back a refused draw (see :func:`~rlreplay.app.tables.draws.undraw`)."""
        draws.undraw(self, taken)

    # -- admission (the engine's, in the caller's task) -----------------------------------

    def admit_puts(self, seq: int, entries: Mapping[str, PendingEntry], weight: int) -> None:
        """Push ``seq`` (``weight`` items) is accepted: readers see its ``entries`` now."""
        self._visible += self.count_unseen(entries)
        self._pending.update(entries)
        self.accept(seq, weight)

    def admit_patches(self, seq: int, entries: Mapping[str, PendingEntry], weight: int) -> None:
        """Patch ``seq`` (``weight`` items) is accepted: readers see its ``entries`` now."""
        self._pending.update(entries)
        self.accept(seq, weight)

    def admit_deletes(self, seq: int, keys: list[str]) -> None:
        """Delete ``seq`` of ``keys`` is accepted: readers no longer see them."""
        doomed: dict[str, PendingEntry] = {k: (seq, None, 0.0) for k in keys}
        self._visible -= sum(1 for key in doomed if self.contains(key))
        self._pending.update(doomed)
        self.accept(seq, len(keys))

    def mark_dropping(self, dropping: bool = True) -> None:
        """A drop is accepted (``dropping``): new calls find no table until it is applied;
        or it was refused (not ``dropping``)."""
        self._dropping = dropping

    def recount_visible(self) -> None:
        """After recovery, nothing pending: readers see the applied items."""
        self._visible = len(self._index)

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
            self._policy_version[slot] = NO_VERSION
            if more and more[0] is not None:
                rollouts.restore(slot, more[0])
            slots[i] = slot
            self._order[slot] = order
            self._priority[slot] = prio
            self._inserted_at[slot] = ts
            self._times_sampled[slot] = sampled
            self._size[slot] = size
            self._version[slot] += 1
            if on_disk:
                self._on_disk[slot] = 1
                self._disk_size[slot] = size
                self._bytes_on_disk += size
            else:
                self._values[slot] = value
                self._dirty[slot] = 1
                cached.append(slot)
                sizes.append(size)
                self._bytes_in_cache += size
        self._next_order = int(self._order[slots].max()) + 1
        given = fields if self.index_fields else None
        if given is not None:
            self._fields.update(zip(slots.tolist(), given, strict=True))
        self.sampler.insert(slots, self._priority[slots], self._inserted_at[slots], given)
        if self.remover is not None:
            self.remover.insert(slots, self._priority[slots], self._inserted_at[slots], given)
        return cached, sizes

    # -- barrier between accepted and applied ---------------------------------------------

    def accept(self, seq: int, weight: int) -> None:
        """Note that op ``seq`` touching ``weight`` items was accepted for this table."""
        self._accepted_seq = seq
        self._pending_ops += weight

    def applied(self, seq: int, weight: int) -> None:
        """Note that the writer applied op ``seq``; wakes readers waiting for it."""
        self._applied_seq = seq
        self._pending_ops -= weight
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
        if self._index:
            self._nonempty.set()
        else:
            self._nonempty.clear()

    async def caught_up(self, timeout_s: float | None = None) -> bool:
        """Wait until every op accepted for this table before the call is applied; False
        if that takes more than ``timeout_s``."""
        target = self._accepted_seq
        if self._applied_seq >= target:
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
        weight, last = 0, self._applied_seq
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
        self._pending.clear()
        self._pending.update(pending)
        self._pending_ops = weight
        self._accepted_seq = last
        index, visible = self._index, len(self._index)
        for key, entry in pending.items():
            if entry[1] is None:
                visible -= key in index
            else:
                visible += key not in index
        self._visible = visible
        self.applied(self._applied_seq, 0)  # readers waiting for a refused op wake up
        if self._barriers:  # those waiting past the last op left: wait for that one
            self._barriers = [(min(t, last), f) for t, f in self._barriers if not f.done()]
            self.applied(self._applied_seq, 0)
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
        if self._index:
            return True
        try:
            await asyncio.wait_for(self._nonempty.wait(), timeout_s)
        except TimeoutError:
            return False
        return bool(self._index)

    # -- read side ------------------------------------------------------------------------

    def follow(self, keep: int) -> ChangeFeed:
        """The table's change feed, started now (holding ``keep`` events) if it has none."""
        if self.changes is None:
            self.changes = ChangeFeed(keep)
        return self.changes

    def visible_size(self) -> int:
        """Items a reader sees now: the applied ones with the pending ops merged in."""
        return self._visible

    def contains(self, key: str) -> bool:
        """Whether a reader sees ``key`` now."""
        entry = self._pending.get(key)
        if entry is not None:
            return entry[1] is not None
        return key in self._index

    def count_unseen(self, keys: Iterable[str]) -> int:
        """How many of ``keys`` a reader does not see now: :meth:`contains` for a batch,
        without a method call per key (it runs per pushed item)."""
        keys = list(keys)
        entries = list(map(self._pending.get, keys))
        if not any(entries):  # none pending (entries are tuples): the index decides
            return len(keys) - sum(map(self._index.__contains__, keys))
        index, unseen = self._index, 0
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
            self._visible,
            self._pending_ops,
            self._bytes_in_cache,
            self._bytes_on_disk,
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
            for a in (
                self._priority,
                self._inserted_at,
                self._times_sampled,
                self._size,
                self._version,
            )
        )
        lists = 8 * (len(self._keys) + len(self._values)) + 5 * len(self._dirty)
        dict_bytes = 100 * len(self._index)  # dict entry + key string, measured in bench
        sel = self.sampler.index_bytes() + (self.remover.index_bytes() if self.remover else 0)
        return cols + lists + dict_bytes + sel
