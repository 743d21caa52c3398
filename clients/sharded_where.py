"""``ShardedReplayClient.sample(where=...)``: a filtered sample over several servers.

A server's ``draw_mass`` describes its whole table, not the items a ``where`` filter
matches there, so the share of each server is read from the servers' own answers instead:
every server draws one probe pick among its matches (``timeout_ms=0``, concurrent; a 504
means it holds none), and a pick's ``probability`` tells its server's matching mass
(``w / probability``, where ``w`` is ``priority ** exponent`` for a ``prioritized`` table
and 1 otherwise). Each place of the batch then goes to a server with probability its
share, a server's probe pick fills its first place, and each server draws the rest of its
places (concurrent again). Probabilities are share times the server's, and prioritized
weights are recomputed over the batch, as :func:`assemble_sample` does for a plain sample.

A probe pick that no place was given to (a server with few matches) still counts as
sampled there (``times_sampled``, the rate limiter), and with ``layout="columns"`` every
probe is such a pick; while no server holds a match the probes repeat after 10 ms,
doubling to 250 ms, until ``timeout_ms``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.shard_fan_out import ShardFanOut
from rlreplay.clients.shard_merge import assemble_sample, draw_weights, split_picks
from rlreplay.clients.types import Item, Layout
from rlreplay.wire.errors import DeadlineExceeded, Unavailable
from rlreplay.wire.schemas import DEFAULT_TIMEOUT_MS

__all__ = ["sample_where"]

_POLL_S: Final = (0.01, 0.25)
_DEFAULT_EXPONENT: Final = 0.6


def _mass(pick: Item, exponent: float | None) -> float:
    """The matching mass of the server that drew ``pick`` (0 when it cannot tell)."""
    probability = float(pick.get("probability") or 0.0)
    if probability <= 0:
        return 0.0
    weight = 1.0 if exponent is None else float(pick.get("priority", 1.0)) ** exponent
    return weight / probability if weight > 0 else 1.0 / probability


async def _probe(
    fan_out: ShardFanOut,
    live: list[int],
    table: str,
    where: dict[str, Any],
    include_values: bool,
    partial: bool,
) -> dict[int, Item]:
    """One pick among its matches from each live server that holds one (unreachable
    servers leave ``live`` with ``partial``)."""
    calls: dict[int, Awaitable[list[Item]]] = {
        s: fan_out.shards[s].sample(
            table, 1, timeout_ms=0, include_values=include_values, where=where
        )
        for s in live
    }
    found: dict[int, Item] = {}
    for s, outcome in (await fan_out.outcomes(calls)).items():
        if isinstance(outcome, DeadlineExceeded):
            continue
        if isinstance(outcome, Unavailable) and partial:
            live.remove(s)
            continue
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome:
            found[s] = outcome[0]
    return found


async def sample_where(
    fan_out: ShardFanOut,
    rng: np.random.Generator,
    table: str,
    batch_size: int,
    where: Mapping[str, Any] | None,
    *,
    timeout_ms: int | None,
    include_values: bool,
    layout: Layout,
    partial: bool,
) -> list[Item] | ColumnBatch:
    """``batch_size`` picks among the items ``where`` matches on every server, as one
    server holding every item would draw them (see the module docstring); without
    ``where``, one server's plain sample (the caller has one).

    Raises:
        DeadlineExceeded: No server held a match within ``timeout_ms``.
        Unavailable: A server cannot be reached (with ``partial``: none can).
    """
    if where is None:  # one server: its share is the whole table, no need to ask
        call = fan_out.shards[0].sample(
            table, batch_size, timeout_ms=timeout_ms, include_values=include_values, layout=layout
        )
        return await fan_out.on(0, call)
    conditions = dict(where)
    timeout_s = (DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms) / 1000
    deadline = time.monotonic() + timeout_s
    live = list(range(len(fan_out.shards)))
    poll = _POLL_S[0]
    while True:
        probes = await _probe(fan_out, live, table, conditions, include_values, partial)
        if probes:
            break
        if not live:
            raise Unavailable(f"no shard of table {table!r} is reachable")
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(
                f"table {table!r} had no item matching the filter on any of "
                f"{len(fan_out.shards)} shards within {timeout_s:g} s"
            )
        await asyncio.sleep(min(poll, left))
        poll = min(2 * poll, _POLL_S[1])
    first = next(iter(probes))
    config = (await fan_out.on(first, fan_out.shards[first].describe_table(table)))["config"]
    sampler = config.get("sampler") or {}
    exponent = (
        float(sampler.get("exponent", _DEFAULT_EXPONENT))
        if sampler.get("type") == "prioritized"
        else None
    )
    mass = {s: _mass(pick, exponent) for s, pick in probes.items()}
    if not any(mass.values()):
        mass = dict.fromkeys(probes, 1.0)
    places = split_picks(rng, np.arange(batch_size, dtype=np.intp), mass)
    left_ms = max(0, int((deadline - time.monotonic()) * 1000))
    reuse = layout == "items"
    calls: dict[int, Awaitable[Any]] = {}
    for s, at in places.items():
        more = len(at) - (1 if reuse else 0)
        if more:
            calls[s] = fan_out.shards[s].sample(
                table,
                more,
                timeout_ms=left_ms,
                include_values=include_values,
                layout=layout,
                where=conditions,
            )
    drawn = await fan_out.each(calls)
    answers: list[tuple[int, npt.NDArray[np.intp], Any]] = []
    for s, at in places.items():
        if reuse:
            answers.append((s, at, [probes[s], *drawn.get(s, [])]))
        else:
            answers.append((s, at, drawn[s]))
    total = sum(mass.values())
    share = {s: m / total for s, m in mass.items()}
    return assemble_sample(answers, share, draw_weights(config), batch_size, layout)
