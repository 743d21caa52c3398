"""Recency-weighted selection: an item's chance halves every ``half_life_s`` of age."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.app.selection.base import Floats, Selector, Slots
from rlreplay.app.selection.param_checks import above_zero
from rlreplay.app.selection.slot_array import grown
from rlreplay.app.selection.sum_tree import SumTree
from rlreplay.app.selection.uniform import UniformSampler

# Exponents of 2 kept within (-_REBASE_AT, _REBASE_AT]: far from float64's 2^±1022 limits.
_REBASE_AT = 512.0


class PTimeSampler(Selector):
    """Picks item ``i`` with probability proportional to ``2^(-age_i / half_life_s)``.

    The age is measured from the moment of the draw, but ``2^(-(now - t_i)/h)`` is
    ``2^(-now/h) · 2^(t_i/h)`` and the first factor is the same for every item, so it
    cancels when the masses are normalised: ``P(i) = 2^((t_i - t0)/h) / Σ_k 2^((t_k - t0)/h)``
    for any reference time ``t0``. Each slot's mass ``2^((t_i - t0)/h)`` sits in a float64
    :class:`SumTree`, so inserts, removals and draws are O(log n) and draws need no clock.

    Rebasing: ``t0`` starts at the first insertion time. When an insert would put a mass
    above ``2^512``, ``t0`` moves forward by a whole number ``k`` of half-lives and every
    leaf is multiplied by ``2^-k`` (exact in binary floating point), so nothing overflows.
    Items more than about 1,000 half-lives older than the newest then underflow to mass 0;
    their true probability is below ``2^-1000`` of the newest item's, so the draw is
    unchanged at float64 precision. If removals leave only such items (total mass below
    ``2^-512``), the masses are recomputed from the stored insertion times with ``t0`` at
    the newest item held, which restores exact proportions.
    """

    name = "ptime"

    def __init__(self, *, half_life_s: float = 60.0) -> None:
        """Creates an empty sampler.

        Args:
            half_life_s: age, in seconds, at which an item is half as likely as a new one; ``> 0``.

        Raises:
            ValueError: ``half_life_s`` is not a finite number ``> 0``; the message names it.
        """
        self._half_life_s = above_zero("half_life_s", half_life_s)
        self._tree = SumTree()
        self._members = UniformSampler()
        self._inserted_at: Floats = np.zeros(1024, dtype=np.float64)
        self._t0: float | None = None

    @property
    def half_life_s(self) -> float:
        """The half-life, in seconds."""
        return self._half_life_s

    def _exponents(self, inserted_at: Floats) -> Floats:
        assert self._t0 is not None
        return np.asarray((inserted_at - self._t0) / self._half_life_s, dtype=np.float64)

    def insert(
        self,
        slots: Slots,
        priorities: Floats,
        inserted_at: Floats,
        fields: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Adds ``slots`` with masses ``2^((t - t0)/h)``, rebasing ``t0`` first if needed."""
        if len(slots) == 0:
            return
        times = np.asarray(inserted_at, dtype=np.float64)
        if not np.all(np.isfinite(times)):
            raise ValueError("inserted_at must be finite")
        self._inserted_at = grown(self._inserted_at, int(slots.max()) + 1, 0.0)
        self._inserted_at[slots] = times
        self._members.insert(slots, priorities, inserted_at)
        if self._t0 is None:
            self._t0 = float(times.max())
        top = float(self._exponents(times).max())
        if top > _REBASE_AT:
            self._shift_t0(math.floor(top))
        self._tree.set(slots, np.exp2(self._exponents(times)))

    def _shift_t0(self, halvings: int) -> None:
        """Moves ``t0`` forward by ``halvings`` half-lives, scaling each leaf by ``2^-halvings``."""
        assert self._t0 is not None
        self._t0 += halvings * self._half_life_s
        leaves = self._tree.leaves
        leaves[:] = np.ldexp(leaves, -halvings)
        self._tree.rebuild()

    def _recompute(self) -> None:
        """Masses afresh from the stored times, with ``t0`` at the newest item held."""
        held = self._members.slots.copy()
        self._t0 = float(self._inserted_at[held].max())
        self._tree.leaves[:] = 0.0
        self._tree.leaves[held] = np.exp2(self._exponents(self._inserted_at[held]))
        self._tree.rebuild()

    def remove(self, slots: Slots) -> None:
        """Drops ``slots``: their mass becomes 0."""
        self._members.remove(slots)
        self._tree.set(slots, np.zeros(len(slots)))
        if len(self._members) == 0:
            self._t0 = None
        elif self._tree.total < 2.0**-_REBASE_AT:
            self._recompute()

    def update(self, slots: Slots, priorities: Floats) -> None:
        """Priorities do not matter to a recency-weighted choice."""
        return None

    def sample(self, n: int, rng: np.random.Generator) -> tuple[Slots, Floats]:
        """``n`` independent draws, newer items more often."""
        total = self._tree.total
        slots = self._tree.find(rng.random(n) * total)
        return slots, self._tree.get(slots) / total

    def __len__(self) -> int:
        """Number of slots held."""
        return len(self._members)

    def index_bytes(self) -> int:
        """The sum tree, the insertion times and the membership set."""
        return self._tree.nbytes + int(self._inserted_at.nbytes) + self._members.index_bytes()
