"""The synchronous clients' episode writer: :class:`~rlreplay.clients.episode_writer.EpisodeWriter`,
its calls made from plain code."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

from rlreplay.clients.blocking_writer import BlockingWriter
from rlreplay.clients.episode_bodies import EndReason
from rlreplay.clients.episode_writer import EpisodeWriter
from rlreplay.clients.loop_thread import LoopThread

__all__ = ["SyncEpisodeWriter"]


class SyncEpisodeWriter:
    """An :class:`~rlreplay.clients.episode_writer.EpisodeWriter` running on a client's loop
    thread::

        with client.episode_writer("episodes", max_in_flight=8) as w:
            for t in range(steps):
                w.append("ep-1", {"obs": obs[None], "reward": rew[None]})
            w.end("ep-1", "terminated")

    Its appends stay in flight on the loop thread while the caller goes on; leaving the
    ``with`` block flushes (the order and error rules are the async writer's). The calls go
    through the :class:`~rlreplay.clients.blocking_writer.BlockingWriter` it holds.

    Args:
        loop: The client's loop thread.
        writer: The async writer, made by the client's async client.
    """

    def __init__(self, loop: LoopThread, writer: EpisodeWriter) -> None:
        self._blocking = BlockingWriter(loop, writer)

    def next_start(self, episode: str) -> int:
        """The number the episode's next appended step gets."""
        return self._blocking.writer.next_start(episode)

    @property
    def appended(self) -> int:
        """Steps the server has accepted so far."""
        return self._blocking.writer.appended

    @property
    def in_flight(self) -> int:
        """Appends sent and not answered yet."""
        return self._blocking.in_flight

    def append(
        self,
        episode: str,
        steps: Mapping[str, Any],
        *,
        priorities: Any = None,
        start: int | None = None,
    ) -> None:
        """Append steps to ``episode``, numbered after its previous ones
        (:meth:`EpisodeWriter.append <rlreplay.clients.episode_writer.EpisodeWriter.append>`)."""
        writer = self._blocking.writer
        self._blocking.run(writer.append(episode, steps, priorities=priorities, start=start))

    def end(
        self, episode: str, reason: EndReason, *, final: Mapping[str, Any] | None = None
    ) -> None:
        """Close ``episode`` after the steps appended so far
        (:meth:`EpisodeWriter.end <rlreplay.clients.episode_writer.EpisodeWriter.end>`)."""
        self._blocking.run(self._blocking.writer.end(episode, reason, final=final))

    def flush(self) -> None:
        """Return once every append made so far is answered."""
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
