"""The synchronous clients' pipelined writer: :class:`~rlreplay.clients.writer.Writer`, its
calls made from plain code."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

from rlreplay.clients.blocking_writer import BlockingWriter
from rlreplay.clients.loop_thread import LoopThread
from rlreplay.clients.writer import Writer
from rlreplay.wire.schemas import DEFAULT_PRIORITY

__all__ = ["SyncWriter"]


class SyncWriter:
    """A :class:`~rlreplay.clients.writer.Writer` running on a client's loop thread::

        with client.writer("rollouts", max_in_flight=8, batch_items=64) as w:
            for step in steps:
                w.append(step.key, {"obs": step.obs}, priority=1.0)

    Its pushes stay in flight on the loop thread while the caller goes on appending; leaving
    the ``with`` block flushes (see :class:`~rlreplay.clients.writer.Writer` for the order
    and error rules, which are the same). The calls go through the
    :class:`~rlreplay.clients.blocking_writer.BlockingWriter` it holds.

    Args:
        loop: The client's loop thread.
        writer: The async writer, made by the client's async client.
    """

    def __init__(self, loop: LoopThread, writer: Writer) -> None:
        self._blocking = BlockingWriter(loop, writer)

    @property
    def pushed(self) -> int:
        """Items the server has accepted so far."""
        return self._blocking.writer.pushed

    @property
    def in_flight(self) -> int:
        """Pushes sent and not answered yet."""
        return self._blocking.in_flight

    def append(self, key: str, value: Any, priority: float = DEFAULT_PRIORITY) -> None:
        """Buffer one item (its value packed now); a full batch is sent
        (:meth:`Writer.append <rlreplay.clients.writer.Writer.append>`)."""
        self._blocking.run(self._blocking.writer.append(key, value, priority))

    def flush(self) -> None:
        """Send what is buffered and return once every push is answered
        (:meth:`Writer.flush <rlreplay.clients.writer.Writer.flush>`)."""
        self._blocking.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._blocking.end_block(exc_type, exc, traceback)
