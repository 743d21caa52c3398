"""A table's rollout state: which fields each item has, which tasks consumed it, leases,
groups and the policy version (the contract's "Rollout tables").

The index lives in memory next to the table's columns, so a claim decides from it alone and
never reads a value to do so:

* :class:`~rlreplay.app.tables.name_masks.Names` numbers each field name (and each task
  name), without a limit; per slot :class:`~rlreplay.app.tables.name_masks.SlotMasks` keep
  the bits of the fields its value has (:attr:`Rollouts.field_masks`, the first 64 names'
  in the table's ``field_mask`` column) and of the tasks that acknowledged it
  (:attr:`Rollouts.acked_masks`, ``acked_mask``). What is durable are the names (in the
  item's metadata record), never the bits, so a bit means what this process made it mean.
* Each :class:`TaskState` keeps the items the task has not acknowledged, oldest first, and
  those it holds under a live lease: a claim walks them from the oldest, skipping the
  leased ones and those still missing a field, so its cost follows what is in flight, not
  the size of the table.
* :class:`Lease` is what a claim handed out; leases live in memory only.

The writer changes the index as it applies pushes, patches, acknowledgements and deletes
(:meth:`Rollouts.on_put`, :meth:`Rollouts.on_free`...); claims, releases and expiries
change the leases on the event loop's thread. Waiting claims wait on :class:`Signal`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from rlreplay.app.tables.items import PatchedItem
from rlreplay.app.tables.name_masks import LOW, Names, SlotMasks
from rlreplay.app.tables.reservations import Reservations
from rlreplay.app.tables.signal import Signal
from rlreplay.app.tables.tag_index import Condition, TagIndex
from rlreplay.wire.errors import ValidationFailed

if TYPE_CHECKING:
    from rlreplay.app.tables.table import Table

__all__ = ["Lease", "Rollouts", "Signal", "TaskState", "field_names"]

#: Field names a table tracked before it tracked any number of them: a table saved by such
#: a version with this many names may have lost some of its items' fields (relearned).
LEGACY_MAX_NAMES = 64
#: A version column's value for an item pushed without one.
NO_VERSION = -1

_FIELDS = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])
_ENCODE = msgspec.msgpack.Encoder()


def field_names(value: bytes) -> list[str]:
    """The top-level field names of a msgpack map value (none for anything else)."""
    try:
        return list(_FIELDS.decode(value))
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):
        return []


def merge_fields(value: bytes, fields: bytes, key: str) -> bytes:
    """``value`` (a msgpack map) with the entries of ``fields`` (a msgpack map) set in it.

    The entries are spliced as their msgpack bytes: nothing below the top level is decoded.

    Raises:
        ValidationFailed: The stored value is not a map with string keys.
    """
    try:
        merged = _FIELDS.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError) as exc:
        raise ValidationFailed(
            f"the value of key {key!r} is not a map of named fields: it cannot be patched"
        ) from exc
    merged.update(_FIELDS.decode(fields))
    return _ENCODE.encode(merged)


def project(value: bytes, names: list[str]) -> bytes:
    """The map ``value`` with only the fields ``names`` (those it has)."""
    try:
        decoded = _FIELDS.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):
        return value
    return _ENCODE.encode({name: decoded[name] for name in names if name in decoded})


@dataclass(eq=False)
class TaskState:
    """What one consumer task has left to consume, and holds.

    ``unacked`` maps an item's insertion order to its slot, oldest first (dicts keep their
    insertion order, and items arrive in order); ``leased`` the orders it holds under a
    lease, to the lease's id.
    """

    name: str
    unacked: dict[int, int] = field(default_factory=dict)
    leased: dict[int, str] = field(default_factory=dict)
    #: The fields its last claim asked for (the ``ready`` count of ``/tasks`` uses them).
    fields: list[str] = field(default_factory=list)
    acked: int = 0
    expired: int = 0


@dataclass(eq=False)
class Lease:
    """Items handed to a task by one claim: key → (slot, order, state), state one of
    ``held``, ``acked``, ``released``."""

    id: str
    task: str
    expires_at: float  # unix time
    deadline: float  # time.monotonic()
    entries: dict[str, list[Any]]
    #: With a claim's ``world_size``: indices into its items, per rank.
    ranks: list[list[int]] | None = None

    def keys(self, keys: list[str] | None) -> list[str]:
        """The lease's keys among ``keys`` (all when None), in the lease's order."""
        if keys is None:
            return list(self.entries)
        return [key for key in dict.fromkeys(keys) if key in self.entries]


class Rollouts:
    """One table's rollout index (see the module docstring)."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.fields = Names()
        self.task_bits = Names()
        self.field_masks = SlotMasks(table, "field_mask")
        self.acked_masks = SlotMasks(table, "acked_mask")
        self.tasks: dict[str, TaskState] = {}
        self.leases: dict[str, Lease] = {}
        self.groups: dict[int, str] = {}  # slot → group, for items pushed with one
        self.tag_index = TagIndex()  # slot → tags, and the index of ``where`` filters
        #: slot → field → length, of the fields a token budget or ``values: false`` measured
        self.lengths: dict[int, dict[str, int]] = {}
        self.expired = 0  # unconsumed items deleted by the table's ``ttl_s``
        self.reservations = Reservations()
        self.version = 0  # the trainer's current policy version
        self.dropped_stale = 0
        self.changed = Signal()
        #: Whether any item was pushed with a group or version (answers then carry them).
        self.has_meta = False
        #: The learning of the fields of the items pushed before the table's first claim
        #: that asks for fields in this process (:meth:`Engine.claim` starts it; claims wait
        #: for it). Pushes record which fields their values have only once it started, so
        #: a table nobody claims fields from never reads its values to find out.
        self.learning: asyncio.Future[None] | None = None
        #: Whether the items' field names were saved whole (see :data:`LEGACY_MAX_NAMES`).
        self.names_whole = True
        #: Whether the learning must read every item's fields again, not only the unknown.
        self.relearn = False

    # -- persistence ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The policy version and the stale rollouts dropped (acknowledgements are saved
        with each item's metadata), and whether the items' field names are saved whole."""
        return {
            "version": self.version,
            "dropped_stale": self.dropped_stale,
            "expired": self.expired,
            "names_whole": not self.relearn,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`. A state without ``names_whole`` was saved by a
        version that tracked at most :data:`LEGACY_MAX_NAMES` field names."""
        self.version = int(state.get("version", 0))
        self.dropped_stale = int(state.get("dropped_stale", 0))
        self.expired = int(state.get("expired", 0))
        self.names_whole = bool(state.get("names_whole", False))

    def meta_of(self, slot: int) -> list[Any] | None:
        """What an item's metadata record keeps of it here: group, version, field names,
        names of the tasks that acknowledged it, and its tags when it has any (None:
        nothing to keep)."""
        t = self.table
        group = self.groups.get(slot)
        version = int(t.policy_version[slot])
        acked = self.acked_masks.get(slot)
        fields = self.field_masks.get(slot)
        tags = self.tag_index.get(slot)
        if group is None and version == NO_VERSION and not acked and not fields and not tags:
            return None
        meta: list[Any] = [
            group,
            None if version == NO_VERSION else version,
            self.fields.names(fields),
            self.task_bits.names(acked),
        ]
        if tags:
            meta.append(tags)
        return meta

    def metas_of(self, slots: np.ndarray) -> list[list[Any] | None] | None:
        """:meth:`meta_of` of each of ``slots`` (distinct), or None when none of them has
        anything to keep: found from the table's columns at once, so a table without
        rollout metadata pays no lookup per item."""
        if self.groups or self.tag_index.of or self.field_masks.high or self.acked_masks.high:
            return [self.meta_of(slot) for slot in slots.tolist()]
        has = (
            (self.table.policy_version[slots] != NO_VERSION)
            | (self.field_masks.low[slots] != 0)
            | (self.acked_masks.low[slots] != 0)
        )
        if not has.any():
            return None
        meta_of = self.meta_of
        return [
            meta_of(slot) if h else None
            for slot, h in zip(slots.tolist(), has.tolist(), strict=True)
        ]

    # -- the writer's hooks -----------------------------------------------------------------

    def on_put(self, slot_list: list[int], items: Any, values: list[bytes]) -> None:
        """New (or replaced) items at ``slot_list``: a replaced item is a new rollout (its
        acknowledgements go; it is consumed again). The writer notifies :attr:`changed`
        once their values can be read."""
        t = self.table
        slots = np.asarray(slot_list, dtype=np.int64)
        self.acked_masks.clear(slots, slot_list)
        if self.learning is not None:
            mask_of, names = self.fields.mask, field_names
            self.field_masks.set_many(slots, [mask_of(names(v)) for v in values])
        else:
            self.field_masks.clear(slots, slot_list)  # not known yet: see learning
        groups = self.groups
        versions = t._policy_version
        if self.lengths:
            for slot in slot_list:
                self.lengths.pop(slot, None)
        tag_index = self.tag_index
        if any(it.tags is not None for it in items) or tag_index.of:
            for slot, it in zip(slot_list, items, strict=True):
                tag_index.put(slot, it.tags)
                if it.tags:
                    self.has_meta = True
        if any(it.group is not None or it.version is not None for it in items):
            for slot, it in zip(slot_list, items, strict=True):
                group, version = it.group, it.version
                if group is None:
                    groups.pop(slot, None)
                else:
                    groups[slot] = group
                    self.has_meta = True
                if version is None:
                    versions[slot] = NO_VERSION
                else:
                    versions[slot] = version
                    self.has_meta = True
        else:  # plain items, the common case
            versions[slots] = NO_VERSION
            if groups:
                for slot in slot_list:
                    groups.pop(slot, None)
        if self.tasks:
            orders = t.order[slots].tolist()
            for task in self.tasks.values():
                unacked, leased = task.unacked, task.leased
                for order, slot in zip(orders, slot_list, strict=True):
                    unacked[order] = slot
                    leased.pop(order, None)

    def forget(self, slot_list: list[int]) -> None:
        """Items about to be replaced or freed: out of every task's lists."""
        if self.tasks:
            orders = self.table.order[slot_list].tolist()
            for task in self.tasks.values():
                unacked, leased = task.unacked, task.leased
                for order in orders:
                    unacked.pop(order, None)
                    leased.pop(order, None)

    def on_free(self, slots: np.ndarray, slot_list: list[int]) -> None:
        """Items freed at distinct ``slots`` (the same as ``slot_list``): their slots forget
        them. The columns are indexed by the array: NumPy converts a list on every use."""
        self.forget(slot_list)
        t = self.table
        self.field_masks.clear(slots, slot_list)
        self.acked_masks.clear(slots, slot_list)
        t._policy_version[slots] = NO_VERSION
        if self.groups:
            for slot in slot_list:
                self.groups.pop(slot, None)
        self.tag_index.remove_many(slot_list)
        self.reservations.room.notify()  # fewer unconsumed items: room for reservations
        if self.lengths:
            for slot in slot_list:
                self.lengths.pop(slot, None)

    def on_patch(self, slot: int, value: bytes) -> None:
        """An item's value got new fields (or its fields are learned: see
        the learning)."""
        self.field_masks.set(slot, self.fields.mask(field_names(value)))
        self.lengths.pop(slot, None)

    def set_tags(self, slot: int, tags: dict[str, Any] | None) -> None:
        """A patch set the item's tags (the merged map)."""
        self.tag_index.put(slot, tags)
        if tags:
            self.has_meta = True
        self.table.mark_meta_dirty(slot)

    def on_ack(self, task_name: str, slots: list[int]) -> None:
        """``task_name`` acknowledged the items at ``slots`` (durably, once applied)."""
        t = self.table
        bit = self.task_bits.bit(task_name)
        if not slots:
            return
        at = np.asarray(slots, dtype=np.int64)
        self.acked_masks.add(at, bit)
        t._meta_dirty[at] = 1
        task = self.tasks.get(task_name)
        if task is not None:
            pop = task.unacked.pop
            for order in t.order[at].tolist():
                pop(order, None)

    def restore(self, slot: int, meta: list[Any]) -> None:
        """An item loaded from storage with the record of :meth:`meta_of`."""
        t = self.table
        group, version, fields, acked, *tags = meta
        if tags and tags[0]:
            self.tag_index.put(slot, dict(tags[0]))
            self.has_meta = True
        if group is not None:
            self.groups[slot] = group
            self.has_meta = True
        if version is not None:
            t._policy_version[slot] = version
            self.has_meta = True
        self.field_masks.set(slot, self.fields.mask(fields))
        self.acked_masks.set(slot, self.task_bits.mask(acked))
        if not self.names_whole and len(self.fields) >= LEGACY_MAX_NAMES:
            self.relearn = True  # the names past the old limit were not saved

    # -- tasks and claims (the event loop's) --------------------------------------------------

    def task(self, name: str) -> TaskState:
        """The state of task ``name``, built from the table on first use."""
        state = self.tasks.get(name)
        if state is not None:
            return state
        t = self.table
        bit = self.task_bits.bit(name)
        n = len(t.keys)
        live = np.flatnonzero(
            np.fromiter((k is not None for k in t.keys), dtype=bool, count=n)
            & self.acked_masks.lacking(n, bit)
        )
        live = live[np.argsort(t.order[live], kind="stable")]
        state = TaskState(name, dict(zip(t.order[live].tolist(), live.tolist(), strict=True)))
        self.tasks[name] = state
        return state

    def floor(self) -> int | None:
        """The lowest version claims and samples hand out (None: no staleness window)."""
        s = self.table.config.max_staleness
        return None if s is None else self.version - s

    def want(self, names: list[str] | None) -> int | None:
        """The bits of the fields a claim asks for; None while one of them is in no item
        yet (a claim asks again once items change: asking numbers no name)."""
        return self.fields.known_mask(names) if names else 0

    def pick(
        self,
        task: TaskState,
        want: int,
        batch_size: int,
        group_size: int | None,
        min_version: int | None,
        where: list[Condition] | None = None,
    ) -> list[int]:
        """The slots of the oldest items ready for ``task``: they have every field of
        ``want``, it neither acknowledged nor holds them, their version is recent enough;
        whole groups of ``group_size`` when given. At most ``batch_size``. ``where``: only
        the items this filter matches."""
        t = self.table
        versions, leased, groups = t.policy_version, task.leased, self.groups
        # the first 64 names' bits are checked in the table's column; later ones, where a
        # claim asks for them, in the masks' dict of the slots that have some
        fmask, high = t.field_mask, self.field_masks.high
        want_u, want_high = np.uint64(want & LOW), want & ~LOW
        low = self.floor()
        if min_version is not None:
            low = min_version if low is None else max(low, min_version)
        out: list[int] = []
        partial: dict[str, list[int]] = {}
        for order, slot in self._walk(task, where):
            if order in leased or (fmask[slot] & want_u) != want_u:
                continue
            if want_high and (high.get(slot, 0) & want_high) != want_high:
                continue
            if low is not None:
                version = versions[slot]
                if version < low and (version != NO_VERSION or min_version is not None):
                    continue
            if group_size is None:
                out.append(slot)
                if len(out) >= batch_size:
                    break
                continue
            group = groups.get(slot)
            if group is None:
                continue
            members = partial.setdefault(group, [])
            members.append(slot)
            if len(members) == group_size:
                out.extend(members)
                partial[group] = []
                if len(out) >= batch_size:
                    break
        return out

    def _walk(self, task: TaskState, where: list[Condition] | None) -> Any:
        """(order, slot) of the task's unacknowledged items, oldest first; of those the
        filter ``where`` matches alone when given: from the index's matches oldest first
        (kept while their tags do not change) less those the task's acknowledged-mask
        bit marks, when they are the smaller, else a walk of the task's items."""
        unacked = task.unacked
        if where is None:
            return unacked.items()
        among = self.tag_index.match(where)
        if len(among) * 4 >= len(unacked):
            return ((o, s) for o, s in unacked.items() if s in among)
        orders, slots = self.tag_index.by_order(where, self.table.order)
        bit = self.task_bits.known(task.name)
        if bit is not None and bit <= LOW and len(slots):
            fresh = (self.acked_masks.low[slots] & np.uint64(bit)) == 0
            orders, slots = orders[fresh], slots[fresh]
        return _chunked(orders, slots, unacked.get)

    def ready_count(self, task: TaskState) -> int:
        """Items ready for ``task`` with the fields its last claim asked for."""
        want = self.want(task.fields)
        if want is None:
            return 0
        return len(self.pick(task, want, len(task.unacked) + 1, None, None))

    def lease(self, task: TaskState, slots: list[int], lease_s: float) -> Lease:
        """Hand ``slots`` to ``task`` under a new lease."""
        t = self.table
        lease_id = secrets.token_urlsafe(12)
        orders = t.order[slots].tolist()
        entries: dict[str, list[Any]] = {}
        for slot, order in zip(slots, orders, strict=True):
            key = t.keys[slot]
            assert key is not None
            entries[key] = [slot, order, "held"]
            task.leased[order] = lease_id
        now = time.time(), time.monotonic()
        lease = Lease(lease_id, task.name, now[0] + lease_s, now[1] + lease_s, entries)
        self.leases[lease_id] = lease
        return lease

    def drop_entries(self, lease: Lease, keys: list[str]) -> None:
        """Take ``keys`` out of a lease before it is answered (their values went meanwhile)."""
        task = self.tasks.get(lease.task)
        for key in keys:
            _slot, order, _ = lease.entries.pop(key)
            if task is not None and task.leased.get(order) == lease.id:
                del task.leased[order]

    def release(self, lease: Lease, keys: list[str], *, expired: bool = False) -> int:
        """Make the held items of ``keys`` ready for the lease's task again; returns how
        many of ``keys`` are released (those released before included)."""
        task = self.tasks.get(lease.task)
        released = 0
        for key in keys:
            entry = lease.entries[key]
            if entry[2] == "held":
                entry[2] = "released"
                if task is not None and task.leased.get(entry[1]) == lease.id:
                    del task.leased[entry[1]]
                    if expired:
                        task.expired += 1
            if entry[2] == "released":
                released += 1
        if released:
            self.changed.notify()
        return released

    def expire(self, lease_id: str) -> None:
        """The lease's time is up: what it holds is ready again, and it is forgotten."""
        lease = self.leases.pop(lease_id, None)
        if lease is not None:
            self.release(lease, list(lease.entries), expired=True)

    def cancel(self, lease: Lease) -> None:
        """Take back a lease that was never answered: what it holds is ready again."""
        if self.leases.pop(lease.id, None) is not None:
            self.release(lease, list(lease.entries))

    def live(self, lease: Lease, key: str) -> int | None:
        """The slot of a leased item if it is still the item handed out (not replaced,
        deleted, nor about to be); None otherwise."""
        t = self.table
        slot, order, _ = lease.entries[key]
        if t.keys[slot] != key or int(t.order[slot]) != order:
            return None
        entry = t.pending.entries.get(key)
        if entry is not None and not isinstance(entry[1], PatchedItem):
            return None
        return int(slot)

    def counts(self) -> dict[str, dict[str, int]]:
        """``/tasks``: per task, items ready, leased, acknowledged, and lease expiries."""
        return {
            name: {
                "ready": self.ready_count(task),
                "leased": len(task.leased),
                "acked": task.acked,
                "expired": task.expired,
            }
            for name, task in sorted(self.tasks.items())
        }


def _chunked(orders: Any, slots: Any, get: Any, chunk: int = 512) -> Any:
    """(order, slot) of the arrays whose slot ``get(order)`` still gives, converted to
    Python a chunk at a time (a claim stops after a few)."""
    for start in range(0, len(slots), chunk):
        part = zip(
            orders[start : start + chunk].tolist(),
            slots[start : start + chunk].tolist(),
            strict=True,
        )
        for o, s in part:
            if get(o) == s:
                yield o, s
