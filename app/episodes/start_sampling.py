"""The table's sampler, choosing among the eligible window starts of one request.

An item table keeps its sampler's state over every item it holds. Which steps may start a
window depends on the request (its length, burn-in, ``start_every``, padding, ``n_step``),
so an episode table computes the choice over the eligible starts of each request
(:func:`~rlreplay.app.episodes.window_starts.eligible_starts`): one vectorised pass, O(starts
eligible) per sample. The probabilities and importance weights are those of the items'
samplers over that set:

- ``uniform``: ``P = 1/N``, weight 1.
- ``prioritized``: ``P(i) = p_i^alpha / Σ_k p_k^alpha`` with the table's ``exponent`` (a
  priority of 0 never drawn; every priority 0: uniform), weights ``(N·P(i))^-beta`` over the
  batch's largest, by :meth:`PrioritizedSampler.weights` itself.
- ``fifo`` / ``lifo``: the start appended first / last (by the step's append order),
  probability 1.
- ``max_heap`` / ``min_heap``: the start of highest / lowest priority, ties to the one
  appended first, probability 1.

``ptime`` (which needs each step's insertion time) and plugin samplers are refused for
episode tables with the message :data:`SUPPORTED` names.

With ``max_times_sampled``, draws are made one after another as items' draws are: a start
drawn its last allowed time leaves the choice, and the picks after it are drawn from what
is left (their probabilities then over the smaller set).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rlreplay.app.selection.base import Floats, Selector, Slots
from rlreplay.app.selection.prioritized import PrioritizedSampler
from rlreplay.app.selection.registry import make_selector

__all__ = ["SUPPORTED", "StartDraw", "StartSampler"]

#: The sampler types an episode table takes.
SUPPORTED = ("uniform", "prioritized", "fifo", "lifo", "max_heap", "min_heap")


@dataclass(frozen=True, slots=True)
class StartDraw:
    """The starts a draw picked.

    Attributes:
        slots: The step slots picked, in draw order (with replacement).
        probabilities: Each pick's probability when it was drawn.
        weights: Each pick's importance weight.
        size: How many starts were eligible.
    """

    slots: Slots
    probabilities: Floats
    weights: Floats
    size: int


class StartSampler:
    """One table's sampler over window starts: its type and parameters, checked once."""

    def __init__(self, sampler_type: str, params: Mapping[str, Any]) -> None:
        """Checks the sampler spec of an episode table.

        Args:
            sampler_type: The config's ``sampler.type``.
            params: Its other parameters (``exponent``, ``is_exponent`` of ``prioritized``).

        Raises:
            ValueError: The type is not one of :data:`SUPPORTED`, or a parameter is bad; the
                message names it.
        """
        if sampler_type not in SUPPORTED:
            raise ValueError(
                f"sampler {sampler_type!r} does not apply to episode tables "
                f"(they take: {', '.join(SUPPORTED)})"
            )
        self.name = sampler_type
        #: The items' selector of that type: its ``weights`` are the weights here.
        self._selector: Selector = make_selector(sampler_type, dict(params))

    def mass(self, eligible: Slots, priority: Floats) -> float:
        """What a draw among ``eligible`` is proportional to, as an item sampler's
        ``draw_mass``: ``Σ p^alpha`` for ``prioritized`` (0 when every priority is 0: draws
        fall back to uniform), the number of starts otherwise."""
        if self.name != "prioritized" or not len(eligible):
            return float(len(eligible))
        assert isinstance(self._selector, PrioritizedSampler)
        pri = np.asarray(priority[eligible], dtype=np.float64)
        return float(prioritized_masses(pri, self._selector.exponent).sum())

    def draw(
        self,
        n: int,
        rng: np.random.Generator,
        *,
        eligible: Slots,
        priority: Floats,
        seq: npt.NDArray[np.int64],
        times_sampled: npt.NDArray[np.int64] | None = None,
        max_times_sampled: int = 0,
    ) -> StartDraw:
        """``n`` picks among the ``eligible`` slots (at least one).

        Args:
            n: How many windows to draw.
            rng: The engine's generator.
            eligible: The slots that may start a window (distinct).
            priority: Per step slot: the priority of the window starting there.
            seq: Per step slot: its append order across the table.
            times_sampled: Per step slot: windows drawn from it so far (with
                ``max_times_sampled``).
            max_times_sampled: The table's limit per start; 0 for none.

        Returns:
            The picks (fewer than ``n`` only when ``max_times_sampled`` used every start up).
        """
        size = len(eligible)
        pri = np.asarray(priority[eligible], dtype=np.float64)
        order = np.asarray(seq[eligible], dtype=np.int64)
        if max_times_sampled > 0 and times_sampled is not None:
            left = max_times_sampled - np.asarray(times_sampled[eligible], dtype=np.int64)
            picks, probs = self._draw_limited(n, rng, pri, order, np.maximum(left, 0))
        else:
            picks, probs = self._pick(n, rng, pri, order, np.ones(size, dtype=bool))
        return StartDraw(eligible[picks], probs, self._selector.weights(probs, size), size)

    def _draw_limited(
        self,
        n: int,
        rng: np.random.Generator,
        pri: Floats,
        order: npt.NDArray[np.int64],
        left: npt.NDArray[np.int64],
    ) -> tuple[npt.NDArray[np.int64], Floats]:
        """Draws one after another, each start at most ``left`` more times."""
        if self.name in ("fifo", "lifo", "max_heap", "min_heap"):
            # the best start, as many times as it may be drawn, then the next best...
            ranked = self._ranking(pri, order)
            ranked = ranked[left[ranked] > 0]
            picks = np.repeat(ranked, left[ranked])[:n]
            return picks.astype(np.int64), np.ones(len(picks))
        active = left > 0
        got_picks: list[int] = []
        got_probs: list[float] = []
        while len(got_picks) < n and active.any():
            picks, probs = self._pick(n - len(got_picks), rng, pri, order, active)
            for pick, prob in zip(picks.tolist(), probs.tolist(), strict=True):
                got_picks.append(pick)
                got_probs.append(prob)
                left[pick] -= 1
                if left[pick] == 0:
                    active[pick] = False
                    break  # the choice changed: draw the rest from what is left
        return np.asarray(got_picks, dtype=np.int64), np.asarray(got_probs, dtype=np.float64)

    def _ranking(self, pri: Floats, order: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Positions in the order a deterministic sampler names them, best first."""
        if self.name == "fifo":
            ranked = np.argsort(order, kind="stable")
        elif self.name == "lifo":
            ranked = np.argsort(-order, kind="stable")
        elif self.name == "max_heap":
            ranked = np.lexsort((order, -pri))
        else:  # min_heap
            ranked = np.lexsort((order, pri))
        return ranked.astype(np.int64, copy=False)

    def _pick(
        self,
        n: int,
        rng: np.random.Generator,
        pri: Floats,
        order: npt.NDArray[np.int64],
        active: npt.NDArray[np.bool_],
    ) -> tuple[npt.NDArray[np.int64], Floats]:
        """``n`` independent picks among the ``active`` positions, and their probabilities."""
        positions = np.flatnonzero(active)
        if self.name == "uniform":
            return _uniform(n, rng, positions)
        if self.name == "prioritized":
            assert isinstance(self._selector, PrioritizedSampler)
            masses = prioritized_masses(pri[positions], self._selector.exponent)
            cumulative = np.cumsum(masses)
            total = float(cumulative[-1])
            if total <= 0.0:  # every priority 0: nothing to weigh by
                return _uniform(n, rng, positions)
            at = np.searchsorted(cumulative, rng.random(n) * total, side="right")
            # u * total may round up to total: the last start that weighs anything
            at = np.minimum(at, int(np.flatnonzero(masses)[-1]))
            return positions[at], masses[at] / total
        best = positions[self._ranking(pri[positions], order[positions])[0]]
        return np.full(n, best, dtype=np.int64), np.ones(n)


def _uniform(
    n: int, rng: np.random.Generator, positions: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], Floats]:
    """``n`` uniform picks among ``positions``."""
    return positions[rng.integers(0, len(positions), size=n)], np.full(n, 1.0 / len(positions))


def prioritized_masses(priorities: Floats, exponent: float) -> Floats:
    """``p^alpha`` as :class:`PrioritizedSampler` weighs items: a priority of 0 weighs 0,
    even for ``alpha = 0``."""
    priorities = np.asarray(priorities, dtype=np.float64)
    if exponent > 0:
        with np.errstate(over="ignore"):
            masses: Floats = priorities**exponent
        return masses
    return np.where(priorities > 0, 1.0, 0.0)
