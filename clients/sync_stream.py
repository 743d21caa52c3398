"""An async iterator running on a :class:`~rlreplay.clients.loop_thread.LoopThread`, handed
out as a plain iterator: what the synchronous clients' ``stream()`` and ``consume()`` return.

Between two ``next()`` calls the async iterator's own work goes on on the loop thread (a
stream's ``prefetch`` sample requests stay in flight while the caller works on a batch).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from types import AsyncGeneratorType, TracebackType
from typing import Any, Generic, Self, TypeVar

from rlreplay.clients.loop_thread import LoopThread

__all__ = ["SyncStream"]

S = TypeVar("S")
T = TypeVar("T")


async def _next(source: AsyncIterator[Any]) -> Any:
    return await anext(source)


class SyncStream(Generic[T]):
    """The items of an async generator that runs on a loop thread, one ``next()`` at a time.

    Close it (or use it as a context manager) to stop the generator at once: a stream then
    cancels its requests in flight, a ``consume()`` releases the lease in hand. Dropped
    unclosed, the generator is closed on its loop soon after.

    Args:
        loop: The loop thread the generator runs on.
        source: The async iterator (an async generator, not started yet).
        convert: Turns each item into what the caller gets.
    """

    def __init__(
        self,
        loop: LoopThread,
        source: AsyncIterator[S],
        convert: Callable[[S], T],
    ) -> None:
        self._loop = loop
        self._source: AsyncIterator[Any] = source
        self._convert: Callable[[Any], T] = convert
        self._done = False

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        try:
            item = self._loop.run(_next(self._source))
        except StopAsyncIteration:
            self._done = True
            raise StopIteration from None
        except BaseException:
            self._done = True  # an error ends the async generator
            raise
        return self._convert(item)

    def close(self) -> None:
        """Stop the generator and wait until it has cleaned up; calling it again, or after
        the client closed (which stopped it), does nothing."""
        source = self._source
        self._done = True
        if not isinstance(source, AsyncGeneratorType) or source.ag_frame is None:
            return  # nothing to close, or it has ended
        if self._loop.closed:
            return  # closing the loop closed it
        self._loop.run(source.aclose())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
