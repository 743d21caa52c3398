"""A pipelined writer of episodes: steps appended per episode, several appends in flight,
each episode's steps numbered for the caller and kept in order.

::

    async with rb.episode_writer("episodes", max_in_flight=8) as w:
        for t in range(steps):
            await w.append(env_id, {"obs": obs[None], "action": act[None], "reward": rew[None]})
        await w.end(env_id, "truncated", final={"obs": last_obs})

:meth:`EpisodeWriter.append` checks and packs the steps at once (changing an array after
appending it does not change what is sent), numbers them from where the episode's previous
append ended (0 for an episode new to the writer, or ``start=`` when the caller resumes
one), and queues the append; it returns once the append is sent. Appends of different
episodes go concurrently, at most ``max_in_flight`` in flight: the next one waits for a
slot, which is the writer's backpressure.

Order within an episode: an append is sent only once the episode's previous append is
answered. The server takes an episode's steps only at the episode's length, and two
requests in flight on two connections may arrive in either order, so one in flight per
episode is what keeps the steps in order (many episodes, written at once, keep the
connections busy; an actor writing one episode step by step waits one round trip per
append: append several steps at once to go faster). :meth:`EpisodeWriter.end` closes an
episode: folded into the episode's append still waiting to be sent when there is one, else
sent as an append of no steps.

Errors: an append that fails (after the client's retries, which reuse its ``request_id``,
so an append is never applied twice) is raised by the next call, once, and its episode's
appends waiting behind it are dropped: the episode has a gap, and appending to it again
raises. Other episodes go on. Exiting the ``async with`` block flushes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import msgspec

from rlreplay.clients.episode_bodies import (
    EndReason,
    PendingAppend,
    pending_append,
)
from rlreplay.clients.in_flight import InFlight
from rlreplay.wire.codec import packb
from rlreplay.wire.episode_schemas import EpisodeStepsRequest

__all__ = ["EpisodeWriter"]

#: Sends one append of an episode and returns how many steps the server accepted.
Send = Callable[[str, EpisodeStepsRequest], Awaitable[int]]

_NO_STEPS = msgspec.Raw(packb({}))


@dataclass(slots=True)
class _Append:
    episode: str
    start: int
    pending: PendingAppend


class EpisodeWriter:
    """Appends steps to episodes, several appends in flight, in order within each episode
    (see the module).

    The appends are sent by an :class:`~rlreplay.clients.in_flight.InFlight` it holds, each
    keyed by its episode, so one of an episode with an append in flight waits while appends
    of other episodes pass it.

    Args:
        send: Sends one append (:meth:`Episodes.episode_writer
            <rlreplay.clients.episodes.Episodes.episode_writer>` passes the client's).
        max_in_flight: Appends in flight at most (at least 1).
    """

    def __init__(self, send: Send, *, max_in_flight: int = 8) -> None:
        self._send = send
        self._appends: InFlight[_Append] = InFlight(
            self._send_append,
            max_in_flight=max_in_flight,
            in_order=False,
            failed=self._failed_append,
            owner="the episode writer",
            jobs="appends",
        )
        self._next: dict[str, int] = {}  # the next step of each episode being written
        self._failed: dict[str, BaseException] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Flushes. When the block raised an exception, sends nothing more and waits for
        the appends in flight, whose errors give way to the block's. When the block was
        cancelled or interrupted, cancels the appends in flight: their steps may or may not
        be stored (a later append with the same steps at the same start is then accepted
        as a retry)."""
        await self._appends.close(exc)

    @property
    def appended(self) -> int:
        """Steps the server has accepted so far."""
        return self._appends.accepted

    @property
    def in_flight(self) -> int:
        """Appends sent and not answered yet."""
        return self._appends.in_flight

    def next_start(self, episode: str) -> int:
        """The number the episode's next appended step gets (0 for one new to the writer
        or ended)."""
        return self._next.get(episode, 0)

    async def append(
        self,
        episode: str,
        steps: Mapping[str, Any],
        *,
        priorities: Any = None,
        start: int | None = None,
    ) -> None:
        """Append steps to ``episode``, numbered after its previous ones; returns once the
        append is sent.

        Args:
            episode: The episode.
            steps: Field -> array whose first axis is the steps (one step: a first axis of
                1), as ``append_steps`` takes them.
            priorities: One per step, as ``append_steps`` takes them.
            start: The first step's number, for an episode some earlier writer began (the
                writer numbers on from there); the writer's own count when None.

        Raises:
            ReplayError: An append sent earlier failed (raised once).
            ValidationFailed: Steps without a common first axis, priorities not one per
                step (nothing is queued).
            RuntimeError: The block has exited, or an earlier append of this episode failed
                (the episode has a gap).
        """
        self._appends.check_open()
        self._appends.raise_error()
        self._check_episode(episode)
        pending = pending_append(steps, priorities=priorities)
        await self._queue(episode, pending, start)

    async def end(
        self, episode: str, reason: EndReason, *, final: Mapping[str, Any] | None = None
    ) -> None:
        """Close ``episode`` after the steps appended so far.

        Args:
            episode: The episode.
            reason: ``"terminated"`` (its last step ended the task: no bootstrap) or
                ``"truncated"`` (cut short: n-step returns bootstrap from ``final``).
            final: The fields' values after the last step (the last observation).

        Raises:
            As :meth:`append`; ValidationFailed for an unknown ``reason``.
        """
        self._appends.check_open()
        self._appends.raise_error()
        self._check_episode(episode)
        queued = self._appends.queued()
        waiting = next((a for a in reversed(queued) if a.episode == episode), None)
        if waiting is not None:
            waiting.pending = waiting.pending.ended(reason, final)
            self._next.pop(episode, None)
            return
        pending = PendingAppend(_NO_STEPS, 0).ended(reason, final)
        await self._queue(episode, pending, None)
        self._next.pop(episode, None)

    async def flush(self) -> None:
        """Return once every append made so far is answered.

        Raises:
            ReplayError: An append failed (the first error; how many more failed noted).
        """
        await self._appends.flush()

    async def _queue(self, episode: str, pending: PendingAppend, start: int | None) -> None:
        first = self._next.get(episode, 0) if start is None else start
        pending.body(first)  # a bad start raises here, before anything is queued
        self._next[episode] = first + pending.count
        sent = self._appends.queue(_Append(episode, first, pending), frozenset((episode,)))
        if not await sent:
            if episode in self._failed:
                raise RuntimeError(
                    f"episode {episode!r}: an earlier append failed, so these steps were not sent"
                ) from self._failed[episode]
            raise RuntimeError("the writer's async with block exited before this was sent")

    async def _send_append(self, queued: _Append) -> int:
        return await self._send(queued.episode, queued.pending.body(queued.start))

    def _failed_append(self, queued: _Append, exc: Exception) -> None:
        """The append failed: its episode has a gap, and its appends queued behind it are
        dropped."""
        episode = queued.episode
        exc.add_note(
            f"the episode writer's append of steps {queued.start} to "
            f"{queued.start + queued.pending.count - 1} of episode {episode!r} failed"
        )
        self._failed[episode] = exc
        self._next.pop(episode, None)
        self._appends.drop(lambda later: later.episode == episode)

    def _check_episode(self, episode: str) -> None:
        if not isinstance(episode, str) or not episode:
            raise ValueError(f"episode must be a non-empty string, not {episode!r}")
        if episode in self._failed:
            raise RuntimeError(
                f"episode {episode!r}: an earlier append failed, leaving a gap; write "
                "its steps again under another name"
            ) from self._failed[episode]
