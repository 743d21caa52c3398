"""A table's reservations: slots a generator holds before it generates (generation
pacing, the contract's "Reservations").

A :class:`Reservation` holds ``granted`` slots until pushes naming it fill them, a
``DELETE`` returns the unfilled ones, or its time is up. :class:`Reservations` keeps a
table's reservations and the counts that ``/tasks`` and ``/metrics`` report; like leases,
they live in memory only (a restart returns every one). Its :attr:`Reservations.room`
signal wakes waiting reservations when room may have come: a reservation returned or
filled, items deleted (the rollout index notifies it as the writer frees them), the
policy version moved.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from rlreplay.app.tables.signal import Signal

__all__ = ["Reservation", "Reservations"]


@dataclass(eq=False, slots=True)
class Reservation:
    """Slots granted to one generator."""

    id: str
    granted: int
    expires_at: float  # unix time
    deadline: float  # time.monotonic()
    filled: int = 0

    @property
    def unfilled(self) -> int:
        """Slots granted that no push filled yet."""
        return self.granted - self.filled


class Reservations:
    """A table's live reservations and their counts (see the module docstring)."""

    def __init__(self) -> None:
        self.live: dict[str, Reservation] = {}
        self.reserved = 0  # unfilled slots of the live reservations
        self.granted_total = 0
        self.filled_total = 0
        self.returned_total = 0
        self.room = Signal()

    def grant(self, count: int, ttl_s: float) -> Reservation:
        """A new reservation of ``count`` slots for ``ttl_s`` seconds."""
        now = time.time(), time.monotonic()
        rid = secrets.token_urlsafe(12)
        reservation = Reservation(rid, count, now[0] + ttl_s, now[1] + ttl_s)
        self.live[rid] = reservation
        self.reserved += count
        self.granted_total += count
        return reservation

    def fill(self, rid: str, n: int) -> int:
        """``n`` items pushed for reservation ``rid`` fill its slots; returns how many
        slots they filled (none for a reservation returned, expired or unknown)."""
        reservation = self.live.get(rid)
        if reservation is None:
            return 0
        filled = min(n, reservation.unfilled)
        reservation.filled += filled
        self.reserved -= filled
        self.filled_total += filled
        if reservation.unfilled == 0:
            del self.live[rid]
        return filled

    def give_back(self, rid: str) -> int | None:
        """Return the unfilled slots of ``rid``; None when it is not live."""
        reservation = self.live.pop(rid, None)
        if reservation is None:
            return None
        returned = reservation.unfilled
        self.reserved -= returned
        self.returned_total += returned
        self.room.notify()
        return returned

    def expire_due(self, now: float) -> int:
        """Return the slots of the reservations whose deadline is before ``now``."""
        due = [rid for rid, r in self.live.items() if r.deadline <= now]
        return sum(self.give_back(rid) or 0 for rid in due)

    def next_deadline(self) -> float | None:
        """The earliest deadline of a live reservation."""
        return min((r.deadline for r in self.live.values()), default=None)

    def give_back_all(self) -> None:
        """The table is dropped: every reservation ends, and waiters look again."""
        for rid in list(self.live):
            self.give_back(rid)
        self.room.notify()
