"""Batched selection over a :class:`~rlreplay.gpu.device_index.DeviceIndex`, on its device.

Random strategies draw with inverse transform sampling: a float64 prefix sum of the masses
and ``torch.searchsorted`` of uniform numbers scaled to the total. ``torch.multinomial`` is
not used: it takes at most 2^24 categories and draws in float32. The prefix sums are built
lazily, on the first draw after the index changed, and reused until it changes again.

What each strategy returns, for ``n`` picks out of the ``N`` items held:

* ``uniform``: each item with probability ``1/N``, weight 1.
* ``prioritized``: ``P(i) = p_i^alpha / sum p_k^alpha`` (priority 0: never, unless every priority is
  0, then uniform), and weights ``(N·P(i))^-beta`` normalised by the batch's largest, computed
  as the server computes them: ``(P_min / P(i))^beta``.
* ``ptime``: ``P(i) ∝ 2^(-age_i / half_life_s)``, weight 1.
* ``topk``, ``fifo``, ``lifo``: the ``n`` items of highest priority, the ``n`` oldest, the
  ``n`` newest (in that order; when fewer than ``n`` are held they repeat from the first),
  probability 1, weight 1: deterministic, like the server's FIFO, LIFO and heaps.

Everything stays on the device: the only host copies are the slots (to name the keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from rlreplay.gpu.device_index import DeviceIndex

__all__ = ["STRATEGIES", "Selection", "Selector", "Strategy"]

Strategy = Literal["uniform", "prioritized", "topk", "fifo", "lifo", "ptime"]
STRATEGIES: tuple[Strategy, ...] = ("uniform", "prioritized", "topk", "fifo", "lifo", "ptime")


@dataclass(frozen=True, slots=True)
class Selection:
    """The picks of one draw: slots, probabilities and weights, all on the device."""

    slots: torch.Tensor  # int64
    probabilities: torch.Tensor  # float64
    weights: torch.Tensor  # float64


class Selector:
    """Draws batches from a device index with a chosen strategy.

    Args:
        index: The index to draw from.
        exponent: alpha of ``prioritized`` (``>= 0``).
        is_exponent: beta of ``prioritized`` (``>= 0``).
        half_life_s: The half-life of ``ptime``, in seconds (``> 0``).

    Raises:
        ValueError: A parameter is out of range; the message names it.
    """

    def __init__(
        self,
        index: DeviceIndex,
        *,
        exponent: float = 0.6,
        is_exponent: float = 0.4,
        half_life_s: float = 60.0,
    ) -> None:
        if not exponent >= 0:
            raise ValueError(f"exponent ({exponent!r}) must be >= 0")
        if not is_exponent >= 0:
            raise ValueError(f"is_exponent ({is_exponent!r}) must be >= 0")
        if not half_life_s > 0:
            raise ValueError(f"half_life_s ({half_life_s!r}) must be > 0")
        self.index = index
        self.exponent = exponent
        self.is_exponent = is_exponent
        self.half_life_s = half_life_s
        # strategy -> (index version, (masses, prefix sum, weighted)) over the used slots
        self._sums: dict[str, tuple[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]]
        self._sums = {}

    def select(self, n: int, strategy: Strategy, generator: torch.Generator) -> Selection:
        """``n`` picks by ``strategy``, drawn with ``generator`` (on the index's device).

        Raises:
            ValueError: ``n`` is below 1, the index is empty, or the strategy is unknown.
        """
        if n < 1:
            raise ValueError(f"batch_size ({n}) must be >= 1")
        if len(self.index) == 0:
            raise ValueError("the table holds no items to select from")
        if strategy in ("uniform", "prioritized", "ptime"):
            return self._draw(n, strategy, generator)
        if strategy in ("topk", "fifo", "lifo"):
            return self._ranked(n, strategy)
        raise ValueError(f"unknown strategy {strategy!r} (known: {', '.join(STRATEGIES)})")

    # -- random strategies ------------------------------------------------------------------

    def _masses(self, strategy: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Each used slot's mass (0 for a free slot), float64, on the device; for
        ``prioritized`` also whether the masses are priorities (a 0-d bool tensor: False
        when every priority is 0 and the draw falls back to uniform, as on the server)."""
        ix = self.index
        used = ix.used
        live = ix.live[:used]
        alive = live.to(torch.float64)
        if strategy == "uniform":
            return alive, None
        zeros = torch.zeros_like(alive)
        if strategy == "prioritized":
            prios = ix.priority[:used]
            if self.exponent > 0:
                masses = prios.pow(self.exponent)
            else:  # alpha = 0: uniform over the items of positive priority
                masses = (prios > 0).to(torch.float64)
            masses = torch.where(live, masses, zeros)
            weighted = masses.sum() > 0
            return torch.where(weighted, masses, alive), weighted
        times = ix.inserted_at[:used]
        newest = torch.where(live, times, torch.full_like(times, -torch.inf)).max()
        return torch.where(live, torch.exp2((times - newest) / self.half_life_s), zeros), None

    def _prefix(self, strategy: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(masses, their prefix sum, weighted)`` of ``strategy``, rebuilt if the index
        changed since the last draw."""
        cached = self._sums.get(strategy)
        if cached is not None and cached[0] == self.index.version:
            return cached[1]
        masses, weighted = self._masses(strategy)
        built = (masses, torch.cumsum(masses, 0), weighted)
        self._sums[strategy] = (self.index.version, built)
        return built

    def _draw(self, n: int, strategy: str, generator: torch.Generator) -> Selection:
        masses, sums, weighted = self._prefix(strategy)
        total = sums[-1]
        u = torch.rand(n, dtype=torch.float64, device=sums.device, generator=generator) * total
        slots = torch.searchsorted(sums, u, right=True).clamp_(max=len(sums) - 1)
        probs = masses[slots] / total
        ones = torch.ones_like(probs)
        if weighted is None:
            return Selection(slots, probs, ones)
        # (P_min / P)^beta: the server's formula, which cannot overflow for a large beta
        ratio = torch.where(probs > 0, probs.min() / probs, ones)
        return Selection(slots, probs, torch.where(weighted, ratio.pow(self.is_exponent), ones))

    # -- deterministic strategies -------------------------------------------------------------

    def _ranked(self, n: int, strategy: str) -> Selection:
        ix = self.index
        used = ix.used
        live = ix.live[:used]
        k = min(n, len(ix))
        if strategy == "topk":
            score = torch.where(live, ix.priority[:used], torch.full_like(ix.priority[:used], -1.0))
            picked = torch.topk(score, k).indices
        else:
            order = ix.order[:used].to(torch.float64)
            sign = -1.0 if strategy == "fifo" else 1.0
            score = torch.where(live, sign * order, torch.full_like(order, -torch.inf))
            picked = torch.topk(score, k).indices
        if k < n:  # fewer items than picks: they repeat, in the same order
            picked = picked.repeat((n + k - 1) // k)[:n]
        ones = torch.ones(n, dtype=torch.float64, device=picked.device)
        return Selection(picked, ones, ones.clone())
