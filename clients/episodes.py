"""The client's calls of episode tables: steps appended per episode, episodes read and
deleted, window priorities set (the contract's "Episode tables").

::

    await rb.create_table("episodes", episodes={}, sampler={"type": "prioritized"})
    n = await rb.append_steps("episodes", "ep-7", {"obs": obs, "reward": rew}, start=0)
    await rb.append_steps("episodes", "ep-7", {"obs": obs2, "reward": rew2}, start=n,
                          end="truncated", final={"obs": last_obs})
    episode = await rb.get_episode("episodes", "ep-7")      # length, end, steps, final
    windows = await rb.sample("episodes", 64, length=80, burn_in=40)

Every append carries a fresh ``request_id``, which its retries reuse: an append that the
server took and whose answer was lost is answered again as it was, not applied twice. Steps
are the server's numbering within the episode; ``start`` says where the steps given begin,
so that a writer that lost track is told (``StepConflict``, whose message gives the
episode's length) rather than leaving a gap. :meth:`Episodes.episode_writer` keeps
track for the caller and keeps several appends in flight.

Sampling windows goes through ``sample`` and ``stream``
(:class:`~rlreplay.clients.samples.Samples`): a call given any of the
:class:`~rlreplay.clients.surface.WindowOptions` (``length``, ``n_step``, ``burn_in``...)
is a window sample and answers a :class:`~rlreplay.clients.windows.WindowBatch`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlreplay.clients.episode_bodies import (
    EndReason,
    WindowStart,
    pending_append,
    priorities_body,
)
from rlreplay.clients.episode_writer import EpisodeWriter
from rlreplay.clients.requester import Requester, answer_map, path_segment, table_path
from rlreplay.clients.rollouts import new_request_id
from rlreplay.wire.episode_schemas import EpisodeStepsRequest
from rlreplay.wire.errors import ItemNotFound

__all__ = ["Episode", "Episodes", "episode_path"]


def episode_path(table: str, episode: str, rest: str = "") -> str:
    """The path of ``episode`` of ``table``, and ``rest`` after it."""
    return table_path(table, "/episodes/" + path_segment(episode, "episode") + rest)


@dataclass(slots=True)
class Episode:
    """An episode as ``get_episode`` reads it.

    Attributes:
        episode: Its name.
        length: The steps it holds (all of them, whatever ``start`` and ``stop`` asked).
        end: ``"terminated"``, ``"truncated"``, or None while it is open.
        steps: Field -> NumPy array of the steps read, the step on the first axis.
        final: The fields' values after the last step, when the episode ended with them.
        start: The number of the first step read.
    """

    episode: str
    length: int
    end: EndReason | None
    steps: dict[str, Any]
    final: dict[str, Any] | None = None
    start: int = 0

    def __len__(self) -> int:
        """The steps read."""
        for column in self.steps.values():
            return len(column)
        return 0


class Episodes:
    """The episode-table calls of :class:`~rlreplay.clients.client.ReplayClient`: appends
    (one by one, or pipelined by an :class:`EpisodeWriter`), reads and deletes of episodes,
    window priorities.

    Args:
        requester: Sends the calls to the server.
    """

    def __init__(self, requester: Requester) -> None:
        self._requester = requester

    async def append_steps(
        self,
        table: str,
        episode: str,
        steps: Mapping[str, Any],
        *,
        start: int,
        priorities: Any = None,
        end: EndReason | None = None,
        final: Mapping[str, Any] | None = None,
        wait: bool = False,
    ) -> int:
        """Append steps to an episode (a new one when ``start`` is 0).

        Args:
            table: The episode table.
            episode: The episode's name (1 to 512 bytes of UTF-8).
            steps: Field -> array whose first axis is the steps (``k``); every step of the
                table has the same fields, dtypes and trailing shapes.
            start: The number of the first step given: the steps the episode holds.
            priorities: One per step: the priority of the window that starts there (the
                table's largest priority when None).
            end: Close the episode after these steps (``k`` may then be 0).
            final: With ``end``: the fields' values after the last step (the last
                observation, which a truncated episode's n-step returns bootstrap from).
            wait: Answer only once the writer has applied the steps.

        Returns:
            How many steps were accepted (``wait=False``) or committed (``wait=True``).

        Raises:
            StepConflict: ``start`` is not the episode's length (its message gives it), the
                steps there are other bytes, or the episode has ended.
            ValidationFailed: The fields, dtypes or shapes differ from the table's.
            TableNotFound, Overloaded: As the contract says.
        """
        pending = pending_append(steps, priorities=priorities, end=end, final=final)
        return await self.append_body(table, episode, pending.body(start, wait=wait))

    async def append_body(self, table: str, episode: str, body: EpisodeStepsRequest) -> int:
        """One append (the episode writers send theirs here)."""
        body.request_id = new_request_id()  # its retries reuse it: an append applies once
        answer = await self._requester.call(
            "POST", episode_path(table, episode, "/steps"), body=body, idempotent=True
        )
        counts = answer_map(answer)
        return int(counts.get("committed", counts.get("accepted", 0)))

    def episode_writer(self, table: str, *, max_in_flight: int = 8) -> EpisodeWriter:
        """A pipelined writer of episodes into ``table`` (see
        :class:`~rlreplay.clients.episode_writer.EpisodeWriter`)::

            async with rb.episode_writer("episodes", max_in_flight=8) as w:
                await w.append("ep-8", {"obs": obs, "reward": rew})
                await w.end("ep-8", "truncated", final={"obs": last_obs})

        Raises:
            ValueError: ``max_in_flight`` is below 1.
        """

        async def send(episode: str, body: EpisodeStepsRequest) -> int:
            return await self.append_body(table, episode, body)

        return EpisodeWriter(send, max_in_flight=max_in_flight)

    async def get_episode(
        self, table: str, episode: str, start: int | None = None, stop: int | None = None
    ) -> Episode | None:
        """An episode's steps ``start`` to ``stop`` (all by default), its length and end.

        Returns:
            The episode, or None when the table holds no such episode.

        Raises:
            TableNotFound: No such table.
            ValidationFailed: Not an episode table.
        """
        query = "&".join(
            f"{name}={int(value)}"
            for name, value in (("start", start), ("stop", stop))
            if value is not None
        )
        path = episode_path(table, episode, "?" + query if query else "")
        try:
            answer = answer_map(
                await self._requester.call("GET", path, idempotent=True, views=True)
            )
        except ItemNotFound:
            return None
        final = answer.get("final")
        return Episode(
            episode=str(answer.get("episode", episode)),
            length=int(answer["length"]),
            end=answer.get("end"),
            steps=dict(answer.get("steps") or {}),
            final=None if final is None else dict(final),
            start=int(answer.get("start", start or 0)),
        )

    async def delete_episode(self, table: str, episode: str) -> None:
        """Delete an episode and its steps (nothing happens when there is none).

        Raises:
            TableNotFound: No such table.
        """
        await self._requester.call("DELETE", episode_path(table, episode), idempotent=True)

    async def update_window_priorities(
        self,
        table: str,
        windows: Iterable[WindowStart],
        *,
        eta: float | None = None,
    ) -> dict[str, int]:
        """Set the priorities of window starts.

        Args:
            table: The episode table.
            windows: ``(episode, start, priority)`` each; with ``eta``,
                ``(episode, start, td)``: the |TD error| of each step of the window sampled
                at that start, which the server mixes into ``eta * max + (1 - eta) * mean``
                (R2D2's priority).
            eta: The mix of the ``td`` form; None for explicit priorities.

        Returns:
            ``{"updated": n, "missing": m}``: starts the table does not hold are counted.
        """
        body = priorities_body(windows, eta)
        if not body.windows:
            return {"updated": 0, "missing": 0}
        path = table_path(table, "/priorities")
        answer = answer_map(await self._requester.call("POST", path, body=body, idempotent=True))
        return {"updated": int(answer.get("updated", 0)), "missing": int(answer.get("missing", 0))}
