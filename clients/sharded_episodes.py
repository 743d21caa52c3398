"""The episode-table calls of the sharded client: each episode on one server, windows drawn
over all of them.

An episode belongs to the server that rendezvous hashing gives its name, as a key's item
does (:mod:`rlreplay.clients.rendezvous`; names sharing a ``{tag}`` share a server): its
appends, reads, deletion and window priorities go there, and its steps stay in order, as
on one server. A window never crosses episodes, so it lies on one server too.

A window sample is drawn as a sharded item sample is (:mod:`rlreplay.clients.sharded_sampling`):
each window goes to a server with probability its share of the table, each server draws its
windows, and a window's ``probability`` is that share times the server's own, with
prioritized weights recomputed over the batch (as
:func:`~rlreplay.clients.shard_merge.prioritized_weights` does).
The share is each server's mass of the window starts the request may draw: a sample of
no windows (``batch_size`` 0) asks each server first, concurrently with its table's
description, for its ``draw_mass`` (``Σ p^alpha`` over those starts for a prioritized table,
their number otherwise) and ``selectable``. So the split is exact for any window shape, and
a server whose episodes hold no window of that shape gets no pick (rather than making the
whole sample wait out its timeout).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rlreplay.clients.episode_bodies import EndReason, WindowStart
from rlreplay.clients.episode_writer import EpisodeWriter
from rlreplay.clients.episodes import Episode
from rlreplay.clients.shard_fan_out import ShardFanOut
from rlreplay.clients.shard_merge import prioritized_weights
from rlreplay.clients.sharded_sampling import ShardedDraw
from rlreplay.clients.surface import WindowOptions
from rlreplay.clients.windows import WindowBatch
from rlreplay.wire.episode_schemas import EpisodeStepsRequest
from rlreplay.wire.errors import ValidationFailed

__all__ = ["ShardedEpisodes", "window_masses"]


def window_masses(figures: Sequence[Mapping[str, Any]]) -> npt.NDArray[np.float64]:
    """Each shard's share of a window sample from the figures of the starts the request
    could draw there: its ``draw_mass``, else (every mass 0: a prioritized table whose
    priorities are all 0, which a server draws uniformly) its ``selectable`` count."""
    for name in ("draw_mass", "selectable"):
        mass = np.array([float(s.get(name) or 0.0) for s in figures], dtype=np.float64)
        if mass.sum() > 0:
            return mass
    return mass


class ShardedEpisodes:
    """Episode calls over several servers (see the module).

    Args:
        fan_out: The servers, and who owns a name.
        draw: Draws samples over them.
    """

    def __init__(self, fan_out: ShardFanOut, draw: ShardedDraw) -> None:
        self._fan_out = fan_out
        self._draw = draw

    def owner(self, episode: str) -> int:
        """The shard that holds ``episode``."""
        return self._fan_out.split([episode]).popitem()[0]

    async def append_steps(
        self,
        table: str,
        episode: str,
        steps: Mapping[str, Any],
        start: int,
        priorities: Any,
        end: EndReason | None,
        final: Mapping[str, Any] | None,
        wait: bool,
    ) -> int:
        """Append steps to an episode on its server (``ReplayClient.append_steps``)."""
        s = self.owner(episode)
        call = self._fan_out.shards[s].append_steps(
            table,
            episode,
            steps,
            start=start,
            priorities=priorities,
            end=end,
            final=final,
            wait=wait,
        )
        return await self._fan_out.on(s, call)

    def episode_writer(self, table: str, *, max_in_flight: int = 8) -> EpisodeWriter:
        """A pipelined episode writer (``ReplayClient.episode_writer``); each append goes
        to its episode's server."""

        async def send(episode: str, body: EpisodeStepsRequest) -> int:
            s = self.owner(episode)
            return await self._fan_out.on(s, self._fan_out.shards[s]._append(table, episode, body))

        return EpisodeWriter(send, max_in_flight=max_in_flight)

    async def get_episode(
        self, table: str, episode: str, start: int | None = None, stop: int | None = None
    ) -> Episode | None:
        """An episode from its server, or None (``ReplayClient.get_episode``)."""
        s = self.owner(episode)
        call = self._fan_out.shards[s].get_episode(table, episode, start, stop)
        return await self._fan_out.on(s, call)

    async def delete_episode(self, table: str, episode: str) -> None:
        """Delete an episode on its server (``ReplayClient.delete_episode``)."""
        s = self.owner(episode)
        await self._fan_out.on(s, self._fan_out.shards[s].delete_episode(table, episode))

    async def update_window_priorities(
        self, table: str, windows: Iterable[WindowStart], *, eta: float | None = None
    ) -> dict[str, int]:
        """Set window starts' priorities on their episodes' servers
        (``ReplayClient.update_window_priorities``)."""
        windows = list(windows)
        names = []
        for i, window in enumerate(windows):
            if not isinstance(window, tuple | list) or len(window) != 3:
                raise ValidationFailed(f"windows[{i}] ({window!r}) must be (episode, start, ...)")
            names.append(str(window[0]))
        if not windows:
            return {"updated": 0, "missing": 0}
        calls = {
            s: self._fan_out.shards[s].update_window_priorities(
                table, [windows[i] for i in places.tolist()], eta=eta
            )
            for s, places in self._fan_out.split(names).items()
        }
        answers = (await self._fan_out.each(calls)).values()
        return {n: sum(a[n] for a in answers) for n in ("updated", "missing")}

    async def sample(
        self,
        table: str,
        batch_size: int,
        timeout_ms: int | None,
        allow_partial: bool | None,
        window: WindowOptions,
    ) -> WindowBatch:
        """Windows drawn over every server (see the module), in the order drawn."""
        shards = self._fan_out.shards
        if len(shards) == 1:
            return await self._fan_out.on(
                0, shards[0]._sample_windows(table, batch_size, timeout_ms, window)
            )

        async def part(s: int, n: int) -> WindowBatch:
            return await shards[s]._sample_windows(table, n, timeout_ms, window)

        async def probe(s: int) -> dict[str, Any]:
            figures = await shards[s]._sample_windows(table, 0, timeout_ms, window)
            if figures.draw_mass is None:
                raise ValidationFailed(
                    f"shard {s} does not report the mass of window starts: its server "
                    "predates sharded window samples"
                )
            return {"draw_mass": figures.draw_mass, "selectable": figures.selectable}

        answers, share, beta = await self._draw.draw(
            table,
            batch_size,
            part,
            timeout_ms=timeout_ms,
            allow_partial=allow_partial,
            masses=window_masses,
            probe=probe,
            what="window",
        )
        got = np.zeros(batch_size, dtype=bool)
        for _, places, batch in answers:
            got[places[: len(batch)]] = True
        rank = np.cumsum(got) - 1
        parts = []
        for s, places, batch in answers:
            batch.probabilities = batch.probabilities * share[s]
            parts.append((batch, np.asarray(rank[places[: len(batch)]], dtype=np.intp)))
        merged = WindowBatch.merged(parts, int(got.sum()))
        if beta is not None:
            merged.weights = prioritized_weights(merged.probabilities, beta)
        return merged
