"""A signal that wakes every waiter once something changed; waiters look again themselves
(no polling: a waiter sleeps until it is notified or its time is up)."""

from __future__ import annotations

import asyncio

from rlreplay.wire.errors import ReplayError

__all__ = ["Signal"]


class Signal:
    """Wakes every waiter once something changed (waiters look again themselves)."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []
        self._ended: ReplayError | None = None

    def notify(self) -> None:
        """Wake the waiters."""
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def end_waits(self, error: ReplayError) -> None:
        """The server stops: every wait, now and later, raises ``error`` (a copy each)."""
        self._ended = error
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_exception(type(error)(error.message))

    async def wait(self, timeout_s: float) -> None:
        """Wait for the next :meth:`notify`, at most ``timeout_s``.

        Raises:
            ReplayError: The error given to :meth:`end_waits`.
        """
        if self._ended is not None:
            raise type(self._ended)(self._ended.message)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(fut, max(0.0, timeout_s))
        except TimeoutError:
            pass
