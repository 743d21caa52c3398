"""How long the event loop went without a turn while something ran (a checkpoint).

A task sleeps :data:`TICK_S` again and again and keeps the longest overshoot: every route
waits as long as the loop does, so the longest overshoot is the longest wait that work
added to any request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType

TICK_S = 0.001


class LoopStalls:
    """``async with LoopStalls() as stalls: ...``; then :attr:`longest_s` is the longest
    stretch (past the tick) the event loop went without running the probe."""

    def __init__(self) -> None:
        self.longest_s = 0.0
        self._task: asyncio.Task[None] | None = None
        self._last = time.perf_counter()

    async def __aenter__(self) -> LoopStalls:
        self._last = time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._probe(), name="loop-stalls")
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._note(self._last)  # the stretch since the last tick counts too

    async def _probe(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self._note(self._last)

    def _note(self, since: float) -> None:
        now = time.perf_counter()
        self.longest_s = max(self.longest_s, now - since - TICK_S)
        self._last = now
