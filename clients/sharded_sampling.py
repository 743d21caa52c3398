"""How a sharded client draws one sample from several servers, items and windows alike.

:class:`ShardedDraw` reads each server's share of the table (its ``draw_mass`` stat, one
request to each, concurrent; or, for windows, each server's figures for the starts the
request could draw, a ``probe``), gives each pick of the batch to a server with probability
its share, and has each server draw its picks (concurrent again), with the arithmetic of
:mod:`rlreplay.clients.shard_merge`. The caller says what one server's part is (an item
sample, a window sample) and puts the answers together: each pick's probability is its
server's share times the server's own, the figure one server holding everything reports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from rlreplay.clients.shard_fan_out import ShardFanOut
from rlreplay.clients.shard_merge import draw_weights, shard_masses, split_picks
from rlreplay.wire.errors import DeadlineExceeded, Unavailable, ValidationFailed
from rlreplay.wire.schemas import DEFAULT_TIMEOUT_MS

__all__ = ["Draw", "ShardedDraw"]

T = TypeVar("T")

#: Polls of an empty sharded table while a sample waits for its first item.
_EMPTY_POLL_S: Final = (0.01, 0.25)

Masses = Callable[[Sequence[Mapping[str, Any]]], npt.NDArray[np.float64]]
"""Each shard's share of a draw from their table stats (:func:`shard_masses` for items)."""
Probe = Callable[[int], Awaitable[Mapping[str, Any]]]
"""``probe(shard)``: figures of one server that stand for its table stats in :data:`Masses`
(``draw_mass`` and ``selectable`` of what one request could draw there)."""


class Draw(NamedTuple):
    """A sharded draw's outcome.

    Attributes:
        answers: Each shard's answer, with the places of its picks in the batch.
        share: Each shard's share of the draw.
        beta: The prioritized sampler's ``beta`` (None for other samplers, whose weights
            stay the servers').
    """

    answers: list[tuple[int, npt.NDArray[np.intp], Any]]
    share: dict[int, float]
    beta: float | None


class ShardedDraw:
    """Draws a batch over several servers (see the module).

    Args:
        fan_out: The servers.
        allow_partial: The default of :meth:`draw`'s ``partial``.
        rng: Splits batches between servers.
    """

    def __init__(
        self, fan_out: ShardFanOut, *, allow_partial: bool, rng: np.random.Generator
    ) -> None:
        self._fan_out = fan_out
        self._allow_partial = allow_partial
        self._rng = rng

    async def draw(
        self,
        table: str,
        batch_size: int,
        part: Callable[[int, int], Awaitable[T]],
        *,
        timeout_ms: int | None,
        allow_partial: bool | None,
        masses: Masses = shard_masses,
        probe: Probe | None = None,
        what: str = "item",
    ) -> Draw:
        """Draw ``batch_size`` picks over the servers.

        Args:
            table: The table.
            batch_size: Picks in all.
            part: ``part(shard, n)`` draws ``n`` picks on one server.
            timeout_ms: How long to wait for a first pick anywhere (the server default
                when None).
            allow_partial: Leave out servers that cannot be reached (the default when None).
            masses: Each shard's share from its stats.
            probe: Asks each shard for the figures ``masses`` reads, instead of its table
                stats (a window sample: the starts of the window asked for).
            what: What is drawn, for the errors.

        Raises:
            Unavailable: A server cannot be reached (or, with ``allow_partial``, none can).
            DeadlineExceeded: No server held anything to draw within ``timeout_ms``.
        """
        if batch_size < 1:
            raise ValidationFailed(f"batch_size ({batch_size}) must be >= 1")
        partial = self._allow_partial if allow_partial is None else allow_partial
        timeout_s = (DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms) / 1000
        deadline = time.monotonic() + timeout_s
        live = list(range(len(self._fan_out.shards)))
        infos = await self._reachable(live, table, partial, probe)
        mass_of = masses([infos[s]["stats"] for s in live])
        poll = _EMPTY_POLL_S[0]
        while mass_of.sum() <= 0:  # nothing anywhere yet: wait for some, as a server does
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(
                    f"table {table!r} had no {what} to sample on any of {len(live)} shards "
                    f"within {timeout_s:g} s"
                )
            await asyncio.sleep(min(poll, left))
            poll = min(2 * poll, _EMPTY_POLL_S[1])
            infos = await self._reachable(live, table, partial, probe)
            mass_of = masses([infos[s]["stats"] for s in live])
        mass = dict(zip(live, mass_of.tolist(), strict=True))
        beta = draw_weights(infos[live[0]]["config"])

        answers: list[tuple[int, npt.NDArray[np.intp], Any]] = []
        todo = np.arange(batch_size, dtype=np.intp)
        while len(todo):
            if not any(mass[s] > 0 for s in live):
                raise Unavailable(f"no shard holding {what}s of table {table!r} is reachable")
            places = split_picks(self._rng, todo, {s: mass[s] for s in live})
            calls = {s: part(s, len(places[s])) for s in places}
            failed: list[npt.NDArray[np.intp]] = []
            errors: list[BaseException] = []
            for s, outcome in (await self._fan_out.outcomes(calls)).items():
                if isinstance(outcome, Unavailable) and partial:
                    live.remove(s)
                    failed.append(places[s])
                elif isinstance(outcome, BaseException):
                    errors.append(outcome)
                else:
                    answers.append((s, places[s], outcome))
            if errors:
                raise errors[0]
            todo = np.sort(np.concatenate(failed)) if failed else todo[:0]
        total = sum(mass[s] for s in live)
        return Draw(answers, {s: mass[s] / total for s in live}, beta)

    async def _reachable(
        self, live: list[int], table: str, partial: bool, probe: Probe | None = None
    ) -> dict[int, Any]:
        """Each live shard's table description (with ``probe``, its ``stats`` are what the
        probe answers); with ``partial``, unreachable ones leave ``live``."""

        async def described(s: int) -> Any:
            info = self._fan_out.shards[s].describe_table(table)
            if probe is None:
                return await info
            got, figures = await asyncio.gather(info, probe(s))
            return {**got, "stats": figures}

        calls = {s: described(s) for s in live}
        if not partial:
            return await self._fan_out.each(calls)
        infos: dict[int, Any] = {}
        for s, outcome in (await self._fan_out.outcomes(calls)).items():
            if isinstance(outcome, Unavailable):
                live.remove(s)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                infos[s] = outcome
        if not live:
            raise Unavailable(f"none of the {len(self._fan_out.urls)} shards is reachable")
        return infos
