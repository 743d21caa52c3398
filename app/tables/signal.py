"""A signal that wakes every waiter once something changed; waiters look again themselves
(no polling: a waiter sleeps until it is notified or its time is up)."""

from __future__ import annotations

import asyncio

__all__ = ["Signal"]


class Signal:
    """Wakes every waiter once something changed (waiters look again themselves)."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        """Wake the waiters."""
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Wait for the next :meth:`notify`, at most ``timeout_s``."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(fut, max(0.0, timeout_s))
        except TimeoutError:
            pass
