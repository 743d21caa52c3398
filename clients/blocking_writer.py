"""What the two synchronous writers share: an async writer driven from plain code.

:class:`~rlreplay.clients.sync_writer.SyncWriter` and
:class:`~rlreplay.clients.sync_episode_writer.SyncEpisodeWriter` each hold a
:class:`BlockingWriter` over their async writer: every call runs on the client's loop thread
and blocks until it is answered, while the writer's sends stay in flight there and the
caller goes on; flushing and the end of the ``with`` block are the async writer's.
"""

from __future__ import annotations

from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from rlreplay.clients.loop_thread import LoopThread

__all__ = ["BlockingWriter"]

T = TypeVar("T")


class _AsyncWriter(Protocol):
    """What a pipelined async writer has (``Writer``, ``EpisodeWriter``)."""

    @property
    def in_flight(self) -> int: ...

    async def flush(self) -> None: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...


W = TypeVar("W", bound=_AsyncWriter)


class BlockingWriter(Generic[W]):
    """An async writer on a client's loop thread, its calls made blocking.

    Args:
        loop: The client's loop thread.
        writer: The async writer, made by the client's async client.
    """

    def __init__(self, loop: LoopThread, writer: W) -> None:
        self._loop = loop
        #: The async writer; await its calls only on the loop thread (:meth:`run` does).
        self.writer = writer

    @property
    def in_flight(self) -> int:
        """The writer's requests sent and not answered yet."""
        return self.writer.in_flight

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        """Run one of the writer's calls on the loop thread; block until it ends."""
        return self._loop.run(call)

    def flush(self) -> None:
        """Block until everything written so far is answered (the writer's ``flush``)."""
        self._loop.run(self.writer.flush())

    def end_block(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """The end of the caller's ``with`` block: the async writer's ``async with`` ends."""
        self._loop.run(self.writer.__aexit__(exc_type, exc, traceback))
