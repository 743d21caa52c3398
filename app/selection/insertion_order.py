"""FIFO and LIFO: the oldest or the newest item, by insertion order."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.app.selection.base import Floats, Selector, Slots
from rlreplay.app.selection.slot_array import grown


class InsertionLog:
    """The slots held, in the order they were inserted, with O(1) oldest and newest.

    Every insertion appends ``(slot, ticket)`` to a log, where the ticket is a counter
    that only grows; a per-slot array remembers each held slot's current ticket. A removal
    only forgets the ticket, leaving a stale entry in the log (a slot that is removed
    and inserted again gets a new ticket, so its old entry is stale too). The ends of the
    log skip stale entries lazily, and when stale entries outnumber the live ones the log
    is compacted in one vectorised pass, so every operation is amortised O(1) and memory
    stays proportional to the items held.

    Re-inserting a slot that is held (a replaced key, if the table does not remove it
    first) moves it to the newest end.
    """

    def __init__(self) -> None:
        """Creates an empty log."""
        self._log_slots = np.empty(1024, dtype=np.int64)
        self._log_tickets = np.empty(1024, dtype=np.int64)
        self._lo = 0
        self._hi = 0
        self._ticket_of = np.full(1024, -1, dtype=np.int64)
        self._next_ticket = 0
        self._live = 0

    def __len__(self) -> int:
        """Number of slots held."""
        return self._live

    @property
    def nbytes(self) -> int:
        """Bytes of the log and the per-slot tickets."""
        return int(self._log_slots.nbytes + self._log_tickets.nbytes + self._ticket_of.nbytes)

    def append(self, slots: Slots) -> None:
        """Records ``slots`` as the newest, in the order given."""
        k = len(slots)
        if k == 0:
            return
        self._ticket_of = grown(self._ticket_of, int(slots.max()) + 1, -1)
        self._live += k - int(np.count_nonzero(self._ticket_of[slots] >= 0))
        if self._hi + k > len(self._log_slots):
            self._compact(room=k)
        tickets = np.arange(self._next_ticket, self._next_ticket + k, dtype=np.int64)
        self._next_ticket += k
        self._log_slots[self._hi : self._hi + k] = slots
        self._log_tickets[self._hi : self._hi + k] = tickets
        self._hi += k
        self._ticket_of[slots] = tickets

    def tickets(self, slots: Slots) -> Slots:
        """The tickets of held ``slots``, for :meth:`put_back`."""
        tickets: Slots = self._ticket_of[slots].copy()
        return tickets

    def put_back(self, slots: Slots, tickets: Slots) -> None:
        """Holds ``slots`` again (not held now) in the places their ``tickets`` had.

        O(n log n): the log is rebuilt in ticket order. It runs only when a draw is taken
        back, which a refused answer does.
        """
        if not len(slots):
            return
        live = self.ordered()  # before the tickets are back: their stale entries stay out
        held = np.concatenate([live, slots])
        held_tickets = np.concatenate([self._ticket_of[live], tickets])
        by_ticket = np.argsort(held_tickets, kind="stable")
        self._ticket_of = grown(self._ticket_of, int(slots.max()) + 1, -1)
        self._ticket_of[slots] = tickets
        self._live += len(slots)
        n = len(held)
        if 2 * n > len(self._log_slots):
            self._log_slots = np.empty(2 * n, dtype=np.int64)
            self._log_tickets = np.empty(2 * n, dtype=np.int64)
        self._log_slots[:n] = held[by_ticket]
        self._log_tickets[:n] = held_tickets[by_ticket]
        self._lo, self._hi = 0, n

    def discard(self, slots: Slots) -> None:
        """Forgets ``slots``; each must be held."""
        self._ticket_of[slots] = -1
        self._live -= len(slots)
        if self._hi - self._lo > 2 * self._live + 1024:
            self._compact(room=0)

    def oldest(self) -> int:
        """The slot inserted longest ago; requires a non-empty log."""
        slots, tickets, ticket_of = self._log_slots, self._log_tickets, self._ticket_of
        lo = self._lo
        while ticket_of[slots[lo]] != tickets[lo]:
            lo += 1
        self._lo = lo
        return int(slots[lo])

    def newest(self) -> int:
        """The slot inserted most recently; requires a non-empty log."""
        slots, tickets, ticket_of = self._log_slots, self._log_tickets, self._ticket_of
        hi = self._hi
        while ticket_of[slots[hi - 1]] != tickets[hi - 1]:
            hi -= 1
        self._hi = hi
        return int(slots[hi - 1])

    def ordered(self) -> Slots:
        """Every slot held, oldest first (O(n); for compaction and tests)."""
        return self._live_between(self._lo, self._hi)

    def oldest_k(self, k: int) -> Slots:
        """The ``k`` oldest slots held, oldest first; ``k`` at most ``len(self)``.

        The stale entries skipped on the way are dropped from the log's old end, so a
        FIFO remover evicting ``k`` at a time looks at each log entry about once instead
        of rescanning every evicted entry until the next compaction.
        """
        width = 2 * k
        while True:
            hi = min(self._hi, self._lo + width)
            at = self._live_positions(self._lo, hi)
            if len(at) >= k or hi >= self._hi:
                at = at[:k]
                self._lo = int(at[0]) if len(at) else hi
                return self._log_slots[at]
            width *= 2

    def newest_k(self, k: int) -> Slots:
        """The ``k`` newest slots held, newest first; ``k`` at most ``len(self)``.

        Like :meth:`oldest_k`, drops the stale entries it skips from the new end.
        """
        width = 2 * k
        while True:
            lo = max(self._lo, self._hi - width)
            at = self._live_positions(lo, self._hi)[::-1]
            if len(at) >= k or lo <= self._lo:
                at = at[:k]
                self._hi = int(at[0]) + 1 if len(at) else lo
                return self._log_slots[at]
            width *= 2

    def _live_positions(self, lo: int, hi: int) -> Slots:
        """The log positions of the live entries between ``lo`` and ``hi``, in log order."""
        live = self._ticket_of[self._log_slots[lo:hi]] == self._log_tickets[lo:hi]
        at: Slots = np.flatnonzero(live) + lo
        return at

    def _live_between(self, lo: int, hi: int) -> Slots:
        """The live entries of the log between positions ``lo`` and ``hi``, in log order."""
        slots: Slots = self._log_slots[lo:hi]
        live: Slots = slots[self._ticket_of[slots] == self._log_tickets[lo:hi]]
        return live

    def _compact(self, room: int) -> None:
        """Drops stale entries and makes space for ``room`` more (growing when half full)."""
        live_slots = self.ordered()
        live_tickets = self._ticket_of[live_slots]
        size = len(self._log_slots)
        if 2 * (len(live_slots) + room) > size:
            size = max(2 * size, 2 * (len(live_slots) + room))
            self._log_slots = np.empty(size, dtype=np.int64)
            self._log_tickets = np.empty(size, dtype=np.int64)
        n = len(live_slots)
        self._log_slots[:n] = live_slots
        self._log_tickets[:n] = live_tickets
        self._lo, self._hi = 0, n


class _InsertionOrderSelector(Selector):
    """Shared state of FIFO and LIFO: an :class:`InsertionLog`."""

    deterministic = True

    def __init__(self) -> None:
        """Creates an empty selector; it takes no parameters."""
        self._log = InsertionLog()

    def insert(
        self,
        slots: Slots,
        priorities: Floats,
        inserted_at: Floats,
        fields: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Appends ``slots`` as the newest, in the order given (not by ``inserted_at``)."""
        self._log.append(slots)

    def remove(self, slots: Slots) -> None:
        """Drops ``slots``."""
        self._log.discard(slots)

    def update(self, slots: Slots, priorities: Floats) -> None:
        """Priorities do not change the order."""
        return None

    def place(self, slots: Slots) -> Slots:
        """Their tickets in the insertion log."""
        return self._log.tickets(slots)

    def put_back(
        self,
        slots: Slots,
        priorities: Floats,
        inserted_at: Floats,
        fields: Sequence[Mapping[str, Any]] | None,
        place: Any,
    ) -> None:
        """Back where they were in insertion order."""
        self._log.put_back(slots, place)

    @abstractmethod
    def _pick(self) -> int:
        """The slot the order names (the oldest or the newest)."""

    def sample(self, n: int, rng: np.random.Generator) -> tuple[Slots, Floats]:
        """The one slot this order names, ``n`` times, with probability 1."""
        return np.full(n, self._pick(), dtype=np.int64), np.ones(n)

    def __len__(self) -> int:
        """Number of slots held."""
        return len(self._log)

    def index_bytes(self) -> int:
        """The insertion log."""
        return self._log.nbytes


class FifoSelector(_InsertionOrderSelector):
    """First in, first out: always the item inserted longest ago.

    As a sampler with ``max_times_sampled = 1`` the table is a queue; as a remover it
    evicts the oldest item, which makes a bounded table a sliding window of recent data.
    """

    name = "fifo"

    def _pick(self) -> int:
        return self._log.oldest()

    def evict(self, k: int, rng: np.random.Generator) -> Slots:
        """The ``k`` oldest items, oldest first, then dropped."""
        picked = self._log.oldest_k(k)
        self._log.discard(picked)
        return picked


class LifoSelector(_InsertionOrderSelector):
    """Last in, first out: always the item inserted most recently.

    As a sampler the table is a stack; as a remover it evicts the newest item, so a
    bounded table keeps the oldest data.
    """

    name = "lifo"

    def _pick(self) -> int:
        return self._log.newest()

    def evict(self, k: int, rng: np.random.Generator) -> Slots:
        """The ``k`` newest items, newest first, then dropped."""
        picked = self._log.newest_k(k)
        self._log.discard(picked)
        return picked
