"""A table's ops accepted and not applied yet: what readers see of them, and the waits.

The engine accepts an op (its log record is appended) before the writer applies it to the
table's index and columns. In between, the op's entries here tell readers what the table
holds: they merge them over the applied index, so a push is visible as soon as it is
accepted. A sample waits until every op accepted before it is applied
(:meth:`PendingOps.caught_up`), so that it draws from the table it was promised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from rlreplay.app.tables.items import NewItem
from rlreplay.wire.errors import ReplayError

PendingEntry = tuple[
    int, NewItem | None, float
]  # (op seq, the item or None for a delete, inserted_at)


class PendingOps:
    """The ops accepted for one table and not applied yet, as readers see them.

    A :class:`~rlreplay.app.tables.table.Table` holds one, as ``table.pending``, built over
    the table's index of applied keys (which it only reads). It keeps, per key, the last
    accepted op on it (:attr:`entries`), the count of items readers see with those merged in
    (:meth:`visible_size`), and the log positions accepted and applied, which the waits
    compare. Everything runs on the event loop's thread. Who calls what:

    * The engine's admission, in the caller's task, on accepting a write:
      :meth:`admit_puts`, :meth:`admit_patches`, :meth:`admit_deletes`, or :meth:`accept`
      for an op that changes no key readers see (priorities, acks, versions).
    * The writer, in log order: :meth:`settle` as it applies an op's items, then
      :meth:`applied`; :meth:`rebuild` (through ``Table.rebuild_pending``) after refused
      ops left its queue; :meth:`forget_applied` for the keys the remover takes;
      :meth:`fail_waiters` when it stops; :meth:`recount_visible` after recovery.
    * Any reader: :attr:`entries`, :meth:`is_visible`, :meth:`visible_size`, and the waits
      :meth:`caught_up` and :meth:`wait_nonempty`.
    * The engine, as the server stops: :meth:`end_waits`, which ends the waits for other
      clients' writes (:meth:`wait_nonempty`, :meth:`applied_after`); a catch-up, which
      only waits for the writer, still gets its answer.
    """

    def __init__(self, index: Mapping[str, int]) -> None:
        self._index = index  # the table's applied keys, read here, changed by the table
        self._entries: dict[str, PendingEntry] = {}
        self._ops = 0  # item ops accepted and not applied
        # What visible_size() answers, kept up to date as ops are accepted (O(1) to read).
        self._visible = 0
        self._accepted_seq = 0
        self._applied_seq = 0
        self._barriers: list[tuple[int, asyncio.Future[None]]] = []
        self._nonempty = asyncio.Event()
        self._held: set[asyncio.Future[None]] = set()  # applied_after()'s barriers
        self._ended: ReplayError | None = None

    @property
    def entries(self) -> Mapping[str, PendingEntry]:
        """Key → the last accepted, unapplied op on it."""
        return self._entries

    @property
    def ops(self) -> int:
        """Item ops accepted and not applied."""
        return self._ops

    @property
    def accepted_seq(self) -> int:
        return self._accepted_seq

    @property
    def applied_seq(self) -> int:
        return self._applied_seq

    # -- what readers see -----------------------------------------------------------------

    def visible_size(self) -> int:
        """Items a reader sees now: the applied ones with the pending ops merged in."""
        return self._visible

    def is_visible(self, key: str) -> bool:
        """Whether a reader sees ``key`` now."""
        entry = self._entries.get(key)
        if entry is not None:
            return entry[1] is not None
        return key in self._index

    def count_unseen(self, keys: Iterable[str]) -> int:
        """How many of ``keys`` a reader does not see now: :meth:`is_visible` for a batch,
        without a method call per key (it runs per pushed item)."""
        keys = list(keys)
        entries = list(map(self._entries.get, keys))
        if not any(entries):  # none pending (entries are tuples): the index decides
            return len(keys) - sum(map(self._index.__contains__, keys))
        index, unseen = self._index, 0
        for key, entry in zip(keys, entries, strict=True):
            if entry[1] is None if entry is not None else key not in index:
                unseen += 1
        return unseen

    # -- admission (the engine's, in the caller's task) -----------------------------------

    def admit_puts(self, seq: int, entries: Mapping[str, PendingEntry], weight: int) -> None:
        """Push ``seq`` (``weight`` items) is accepted: readers see its ``entries`` now."""
        self._visible += self.count_unseen(entries)
        self._entries.update(entries)
        self.accept(seq, weight)

    def admit_patches(self, seq: int, entries: Mapping[str, PendingEntry], weight: int) -> None:
        """Patch ``seq`` (``weight`` items) is accepted: readers see its ``entries`` now."""
        self._entries.update(entries)
        self.accept(seq, weight)

    def admit_deletes(self, seq: int, keys: list[str]) -> None:
        """Delete ``seq`` of ``keys`` is accepted: readers no longer see them."""
        doomed: dict[str, PendingEntry] = {k: (seq, None, 0.0) for k in keys}
        self._visible -= sum(1 for key in doomed if self.is_visible(key))
        self._entries.update(doomed)
        self.accept(seq, len(keys))

    def accept(self, seq: int, weight: int) -> None:
        """Note that op ``seq`` touching ``weight`` items was accepted for this table."""
        self._accepted_seq = seq
        self._ops += weight

    # -- the writer's ---------------------------------------------------------------------

    def settle(self, keys: Iterable[str], seqs: Iterable[int]) -> None:
        """The writer applied, for each of ``keys``, the op ``seq`` beside it: its pending
        entry goes, unless a later op's replaced it."""
        pending = self._entries
        get = pending.get
        for key, seq in zip(keys, seqs, strict=False):  # seqs: often itertools.repeat
            entry = get(key)
            if entry is not None and entry[0] == seq:
                del pending[key]

    def forget_applied(self, keys: list[str]) -> None:
        """The applied ``keys`` leave the table without an op (the remover took them):
        readers stop seeing those a pending op does not decide."""
        self._visible -= len(keys) - sum(map(self._entries.__contains__, keys))

    def applied(self, seq: int, weight: int) -> None:
        """Note that the writer applied op ``seq``; wakes readers waiting for it."""
        self._applied_seq = seq
        self._ops -= weight
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

    def rebuild(self, ops: Iterable[Any], applying: Any = None) -> None:
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
        self._entries.clear()
        self._entries.update(pending)
        self._ops = weight
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

    def recount_visible(self) -> None:
        """After recovery, nothing pending: readers see the applied items."""
        self._visible = len(self._index)

    def fail_waiters(self, exc: BaseException) -> None:
        """The writer stopped: fail every reader waiting on it."""
        for _, fut in self._barriers:
            if not fut.done():
                fut.set_exception(exc)
        self._barriers = []

    # -- the waits (any reader's) ---------------------------------------------------------

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
            fut.cancel()  # applied() and rebuild() skip it
            return False
        return True

    async def applied_after(self, seq: int, timeout_s: float) -> bool:
        """Wait until the writer applies an op of this table after log position ``seq``
        (an episode table's sample waiting for a window to start); False on timeout."""
        if self._applied_seq > seq:
            return True
        self._raise_if_ended()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._barriers.append((seq + 1, fut))
        self._held.add(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), max(0.0, timeout_s))
        except TimeoutError:
            fut.cancel()  # applied() and rebuild() skip it
            return False
        finally:
            self._held.discard(fut)
        return True

    async def wait_nonempty(self, timeout_s: float) -> bool:
        """Wait until the applied state holds an item; False on timeout."""
        if self._index:
            return True
        self._raise_if_ended()
        try:
            await asyncio.wait_for(self._nonempty.wait(), timeout_s)
        except TimeoutError:
            return False
        if not self._index:
            self._raise_if_ended()
        return bool(self._index)

    def end_waits(self, error: ReplayError) -> None:
        """The server stops: :meth:`wait_nonempty` and :meth:`applied_after`, now and
        later, raise ``error`` (a copy each) rather than wait for writes that may not come."""
        self._ended = error
        for fut in self._held:
            if not fut.done():
                fut.set_exception(type(error)(error.message))
        self._nonempty.set()  # its waiters look again (applied() sets it right again)

    def _raise_if_ended(self) -> None:
        if self._ended is not None:
            raise type(self._ended)(self._ended.message)
