"""Keeping a number of requests in flight and yielding their answers as they arrive: the
loop behind ``stream()`` of both clients."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

__all__ = ["prefetched"]

T = TypeVar("T")


async def prefetched(fetch: Callable[[], Awaitable[T]], prefetch: int) -> AsyncGenerator[T, None]:
    """Answers of ``fetch()`` without end, ``prefetch`` calls in flight.

    The calls are tasks owned by the generator: while the caller works on one answer,
    ``prefetch`` more are on their way. Answers are yielded in the order they arrive; the
    first error ends the generator with it. Closing the generator cancels the calls still
    in flight and waits for them.

    Raises:
        ValueError: ``prefetch`` is below 1.
    """
    if prefetch < 1:
        raise ValueError(f"prefetch ({prefetch}) must be >= 1")
    pending: list[asyncio.Task[T]] = []  # in issue order

    async def call() -> T:
        return await fetch()

    def top_up() -> None:
        while len(pending) < prefetch:
            pending.append(asyncio.create_task(call()))

    try:
        while True:
            top_up()
            if not any(task.done() for task in pending):
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            task = next(task for task in pending if task.done())
            pending.remove(task)
            answer = task.result()  # raises the call's error
            top_up()
            yield answer
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
