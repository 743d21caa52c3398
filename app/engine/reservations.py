"""The engine's reservations part: granting slots to generators, filling them by pushes,
returning them, and returning them when their time is up (generation pacing).

A reservation is granted once the table's reserved slots plus its items not yet consumed
(not acknowledged by every task of ``delete_after_ack``: those are deleted, so the items a
reader sees) stay within ``admission.max_ahead`` (a table without ``admission`` grants
every slot asked), and only while the generator's version is within the staleness window:
a version below ``current - max_staleness`` is refused with 409 ``version_conflict`` at
once, since versions never go back and waiting could not help. Otherwise it waits, on the
table's ``room`` signal (never polling), up to ``wait_ms`` for at least one slot, then
answers 504 ``deadline_exceeded``.

:class:`ReservationDesk` owns one background task that returns expired reservations at
their deadline; reservations live in memory only, like leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from rlreplay.app.engine.core import EngineCore
from rlreplay.app.tables.reservations import Reservation
from rlreplay.app.tables.table import Table
from rlreplay.wire.errors import DeadlineExceeded, LeaseNotFound, VersionConflict

__all__ = ["ReservationDesk"]

log = logging.getLogger("rlreplay.reservations")


class ReservationDesk:
    """Reservations of every table, and the task that expires them (``start``/``stop``)."""

    def __init__(self, core: EngineCore) -> None:
        self._core = core
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failures = 0

    # -- lifetime -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the expiry task."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="rlreplay-reservation-expiry"
            )

    async def stop(self) -> None:
        """Stop the expiry task; idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def forget_table(self, t: Table) -> None:
        """``t`` is being dropped: its reservations end and their waiters look again."""
        t.rollouts.reservations.give_back_all()

    # -- calls ----------------------------------------------------------------------------

    async def reserve(
        self, table: str, count: int, version: int, *, wait_ms: int, ttl_s: float
    ) -> Reservation:
        """Grant up to ``count`` slots (see the module docstring)."""
        t = self._core.table(table)
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            self._check_version(t, version)
            room = self._room(t)
            if room > 0:
                reservation = t.rollouts.reservations.grant(min(count, room), ttl_s)
                self._wake.set()
                return reservation
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(
                    f"table {table!r}: no slot came free within {wait_ms / 1000:g} s "
                    f"(admission.max_ahead {self._max_ahead(t)})"
                )
            await t.rollouts.reservations.room.wait(left)
            t = self._core.table(table)  # TableNotFound once dropped

    def fill(self, table: str, rid: str, n: int) -> int:
        """``n`` items pushed naming reservation ``rid`` fill its slots (a reservation
        returned, expired or unknown fills nothing: the push is kept all the same)."""
        t = self._core.current_state.tables.get(table) if self._core.current_state else None
        if t is None:
            return 0
        return t.rollouts.reservations.fill(rid, n)

    def cancel(self, table: str, rid: str) -> int:
        """Return the unfilled slots of ``rid``; LeaseNotFound when it is not live."""
        t = self._core.table(table)
        returned = t.rollouts.reservations.give_back(rid)
        if returned is None:
            raise LeaseNotFound(f"no live reservation {rid!r} on table {table!r}")
        return returned

    def expire(self, *, before: float | None = None) -> int:
        """Return the reservations whose deadline (``time.monotonic()``) is before
        ``before`` (default: now) in every table; tests pass a time ahead."""
        state = self._core.current_state
        if state is None:
            return 0
        now = time.monotonic() if before is None else before
        return sum(t.rollouts.reservations.expire_due(now) for t in list(state.tables.values()))

    def stats(self) -> dict[str, dict[str, int]]:
        """Per table with reservations or expiry: its counts (for ``/metrics``)."""
        state = self._core.current_state
        if state is None or not self._core.is_open:
            return {}
        out = {}
        for name, t in state.tables.items():
            r = t.rollouts.reservations
            if r.granted_total or t.rollouts.expired or t.config.admission or t.config.ttl_s:
                out[name] = {
                    "reserved": r.reserved,
                    "granted": r.granted_total,
                    "filled": r.filled_total,
                    "returned": r.returned_total,
                    "expired": t.rollouts.expired,
                }
        return out

    # -- parts ----------------------------------------------------------------------------

    @staticmethod
    def _max_ahead(t: Table) -> int | None:
        admission = t.config.admission
        return None if admission is None else admission.max_ahead

    def _room(self, t: Table) -> int:
        """Slots a reservation may be granted now (unbounded: a large number)."""
        max_ahead = self._max_ahead(t)
        if max_ahead is None:
            return 2**62
        return max_ahead - t.rollouts.reservations.reserved - t.visible_size()

    @staticmethod
    def _check_version(t: Table, version: int) -> None:
        floor = t.rollouts.floor()
        if floor is not None and version < floor:
            raise VersionConflict(
                f"table {t.name!r} is at policy version {t.rollouts.version} with "
                f"max_staleness {t.config.max_staleness}: rollouts of version {version} "
                "would be dropped as stale"
            )

    async def _run(self) -> None:
        while True:
            try:
                self.expire()
            except Exception:  # a bug here must not end expiry for every table
                self.failures += 1
                log.exception("returning expired reservations failed")
            self._wake.clear()
            timeout = self._next_deadline()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _next_deadline(self) -> float | None:
        state = self._core.current_state
        if state is None:
            return 1.0
        deadlines: list[float] = [
            d
            for t in state.tables.values()
            if (d := t.rollouts.reservations.next_deadline()) is not None
        ]
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())
