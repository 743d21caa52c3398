"""Lease expiry: the server releases what a lease still holds once its time is up.

:class:`LeaseExpiry` owns one task that sleeps until the earliest lease deadline (a heap of
them), releases the leases due, and sleeps again; a new lease that ends sooner wakes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlreplay.app.tables.rollouts import Lease
    from rlreplay.app.tables.table import Table

__all__ = ["LeaseExpiry"]


class LeaseExpiry:
    """Releases expired leases, of every table, in one owned task (``start``/``stop``)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Table, str]] = []
        self._count = 0  # ties in the heap never compare tables
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the task."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="rlreplay-lease-expiry"
            )

    async def stop(self) -> None:
        """Stop the task; idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def schedule(self, table: Table, lease: Lease) -> None:
        """Release ``lease`` of ``table`` at its deadline."""
        self._count += 1
        entry = (lease.deadline, self._count, table, lease.id)
        heapq.heappush(self._heap, entry)
        if self._heap[0] is entry:
            self._wake.set()

    def expire_due(self, now: float | None = None) -> None:
        """Release every lease whose deadline (``time.monotonic()``) is before ``now``
        (default: the present)."""
        heap = self._heap
        now = time.monotonic() if now is None else now
        while heap and heap[0][0] <= now:
            _, _, table, lease_id = heapq.heappop(heap)
            lease = table.rollouts.leases.get(lease_id)
            if lease is not None and not table.dropped:
                lease.deadline = min(lease.deadline, now)  # an ack from now on is too late
                table.rollouts.expire(lease_id)

    async def _run(self) -> None:
        while True:
            self.expire_due()
            self._wake.clear()
            timeout = self._heap[0][0] - time.monotonic() if self._heap else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
