"""Batched selection over a :class:`~rlreplay.gpu.device_index.DeviceIndex`, on its device.

Random strategies draw with inverse transform sampling over float64 prefix sums of the
masses (:class:`BlockedSums`): uniform numbers scaled to the total, then ``searchsorted``.
``torch.multinomial`` is not used: it takes at most 2^24 categories and draws in float32.
The sums are refreshed lazily, on the first draw after the index changed, and only where
it changed (``ptime``, whose masses all move with the newest item, rebuilds them).

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

__all__ = ["STRATEGIES", "BlockedSums", "Selection", "Selector", "Strategy"]

Strategy = Literal["uniform", "prioritized", "topk", "fifo", "lifo", "ptime"]
STRATEGIES: tuple[Strategy, ...] = ("uniform", "prioritized", "topk", "fifo", "lifo", "ptime")


_BLOCK = 256  # slots per block of BlockedSums (a power of two)
_BLOCK_STEPS = _BLOCK.bit_length() - 1
_GATHER_ROWS_UP_TO = 1024  # picks; on the CPU, more bisect instead (measured in bench)


class BlockedSums:
    """Prefix sums of per-slot masses in two levels, for draws and cheap refreshes.

    Slots are grouped in blocks of 256: each block keeps the running sum of its own masses,
    and a prefix sum runs over the blocks' totals. Changing ``k`` masses redoes the running
    sums of at most ``k`` blocks and the (256 times shorter) prefix over blocks, instead of
    a prefix sum over every slot. A draw finds its block by ``searchsorted`` and its slot in
    the block by a ``searchsorted`` of the gathered block (or, for large batches on the CPU,
    an 8-step bisection), all on the device. Everything is float64.
    """

    def __init__(self, masses: torch.Tensor) -> None:
        """Sums over ``masses`` (one per slot; its length a multiple of 256 is kept)."""
        size = len(masses)
        padded = -(-size // _BLOCK) * _BLOCK
        self.size = size
        self.masses = torch.zeros(padded, dtype=torch.float64, device=masses.device)
        self.masses[:size] = masses
        self.local = self.masses.view(-1, _BLOCK).cumsum(1)
        self.blocks = self.local[:, -1].cumsum(0)
        self.total = self.blocks[-1]

    def update(self, slots: torch.Tensor, masses: torch.Tensor) -> None:
        """New masses at ``slots`` (repeats allowed: they carry the same value)."""
        self.masses[slots] = masses
        touched = torch.unique(torch.div(slots, _BLOCK, rounding_mode="floor"))
        self.local[touched] = self.masses.view(-1, _BLOCK)[touched].cumsum(1)
        self.blocks = self.local[:, -1].cumsum(0)
        self.total = self.blocks[-1]

    def find(self, points: torch.Tensor) -> torch.Tensor:
        """For each point in ``[0, total)``, the slot whose mass interval holds it."""
        last = len(self.blocks) - 1
        block = torch.searchsorted(self.blocks, points, right=True).clamp_(max=last)
        lo = block * _BLOCK  # flat positions
        flat = self.local.view(-1)
        rest = points - (self.blocks[block] - flat.take(lo + _BLOCK - 1))
        if points.device.type != "cpu" or len(points) <= _GATHER_ROWS_UP_TO:
            # a few kernels: gather each pick's block and search it (a device is bound by
            # kernel launches; the CPU too, for small batches)
            rows = self.local[block]
            within = torch.searchsorted(rows, rest.unsqueeze(1), right=True).squeeze(1)
            return lo + within.clamp_(max=_BLOCK - 1)
        width = _BLOCK  # large batches on the CPU: bisect in place, no gathered rows
        for _ in range(_BLOCK_STEPS):  # the first slot of the block whose running sum > rest
            width //= 2
            lo = torch.where(flat.take(lo + width - 1) <= rest, lo + width, lo)
        return lo


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
        # strategy -> (the index version they describe, prefix sums of the masses)
        self._sums: dict[str, tuple[int, BlockedSums]] = {}

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

    def _masses(self, strategy: str, slots: torch.Tensor | None = None) -> torch.Tensor:
        """The masses of ``slots`` (every slot of the index when None) for ``strategy``:
        0 for a free slot, float64, on the device."""
        ix = self.index
        live = ix.live if slots is None else ix.live[slots]
        alive = live.to(torch.float64)
        if strategy == "uniform":
            return alive
        zeros = torch.zeros_like(alive)
        if strategy == "prioritized":
            prios = ix.priority if slots is None else ix.priority[slots]
            if self.exponent > 0:
                masses = prios.pow(self.exponent)
            else:  # alpha = 0: uniform over the items of positive priority
                masses = (prios > 0).to(torch.float64)
            return torch.where(live, masses, zeros)
        times = ix.inserted_at  # ptime: relative to the newest item, always all of them
        newest = torch.where(ix.live, times, torch.full_like(times, -torch.inf)).max()
        return torch.where(ix.live, torch.exp2((times - newest) / self.half_life_s), zeros)

    def _sums_of(self, strategy: str) -> BlockedSums:
        """The prefix sums of ``strategy``'s masses as of the index's version: refreshed
        where the index changed since the last draw, or rebuilt when that is unknown."""
        ix = self.index
        cached = self._sums.get(strategy)
        if cached is not None and cached[0] == ix.version:
            return cached[1]
        changed = None
        if cached is not None and strategy != "ptime" and cached[1].size == ix.capacity:
            changed = ix.changed_since(cached[0])
        if changed is None or cached is None:
            sums = BlockedSums(self._masses(strategy))
        else:
            sums = cached[1]
            if len(changed):
                sums.update(changed, self._masses(strategy, changed))
        self._sums[strategy] = (ix.version, sums)
        return sums

    def _draw(self, n: int, strategy: str, generator: torch.Generator) -> Selection:
        sums = self._sums_of(strategy)
        u = torch.rand(n, dtype=torch.float64, device=sums.masses.device, generator=generator)
        slots = sums.find(u * sums.total)
        probs = sums.masses[slots] / sums.total
        ones = torch.ones_like(probs)
        if strategy != "prioritized":
            return Selection(slots, probs, ones)
        # every priority 0: uniform, as on the server; chosen on the device, no host sync
        weighted = sums.total > 0
        even = self._sums_of("uniform")
        even_slots = even.find(u * even.total)
        slots = torch.where(weighted, slots, even_slots)
        probs = torch.where(weighted, probs, even.masses[even_slots] / even.total)
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
