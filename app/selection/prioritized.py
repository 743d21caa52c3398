"""Prioritized experience replay (Schaul et al., 2015) over a float64 sum tree."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.app.selection.base import Floats, Selector, Slots
from rlreplay.app.selection.param_checks import at_least_zero
from rlreplay.app.selection.sum_tree import SumTree
from rlreplay.app.selection.uniform import UniformSampler


class PrioritizedSampler(Selector):
    """Picks item ``i`` with probability ``P(i) = p_i^alpha / Σ_k p_k^alpha``.

    Each slot's mass ``p^alpha`` sits in a float64 :class:`SumTree`; a batch of draws is one
    vectorised descent of the tree, and a batch of updates one vectorised refresh of the
    paths above the changed leaves, both O(log n) numpy steps.

    Zero priorities: an item of priority 0 has mass 0 and is never drawn, whatever ``alpha``
    (``0^0`` is taken as 0 here, so ``alpha = 0`` means "uniform over the items of positive
    priority"). When every item held has priority 0 there is nothing to weigh by, and
    draws fall back to uniform over all the items held (probability ``1/N``, weight 1).

    Importance weights: ``weights`` returns ``(N·P(i))^-beta`` divided by the largest such
    value in the batch, so the weights lie in ``[0, 1]`` (0 only where the ratio underflows).
    """

    name = "prioritized"
    weighted = True

    def __init__(self, *, exponent: float = 0.6, is_exponent: float = 0.4) -> None:
        """Creates an empty sampler.

        Args:
            exponent: alpha, how strongly priorities shape the draw (0: uniform); ``>= 0``.
            is_exponent: beta, the importance-sampling exponent of the weights; ``>= 0``.

        Raises:
            ValueError: a parameter is not a finite number in range; the message names it.
        """
        self._exponent = at_least_zero("exponent", exponent)
        self._is_exponent = at_least_zero("is_exponent", is_exponent)
        self._tree = SumTree()
        self._members = UniformSampler()

    @property
    def exponent(self) -> float:
        """alpha."""
        return self._exponent

    @property
    def is_exponent(self) -> float:
        """beta."""
        return self._is_exponent

    def _masses(self, priorities: Floats) -> Floats:
        priorities = np.asarray(priorities, dtype=np.float64)
        if len(priorities) and not (priorities.min() >= 0 and np.isfinite(priorities.sum())):
            bad = priorities[~(np.isfinite(priorities) & (priorities >= 0))][0]
            raise ValueError(f"priority ({bad!r}) must be finite and >= 0")
        with np.errstate(over="ignore"):
            if self._exponent > 0:  # 0 ** alpha is already 0
                masses = priorities**self._exponent
            else:  # alpha = 0: every item alike, but a priority-0 item is still never drawn
                masses = np.where(priorities > 0, 1.0, 0.0)
        if not np.isfinite(masses.sum()):
            raise ValueError(f"priority ** exponent overflows for exponent ({self._exponent!r})")
        return masses

    def insert(
        self,
        slots: Slots,
        priorities: Floats,
        inserted_at: Floats,
        fields: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Adds ``slots`` with masses ``priorities ** alpha``."""
        masses = self._masses(priorities)
        self._members.insert(slots, priorities, inserted_at)
        self._tree.set(slots, masses)

    def remove(self, slots: Slots) -> None:
        """Drops ``slots``: their mass becomes 0."""
        self._members.remove(slots)
        self._tree.set(slots, np.zeros(len(slots)))

    def update(self, slots: Slots, priorities: Floats) -> None:
        """New priorities; the sums above the changed leaves are refreshed in one batch."""
        self._tree.set(slots, self._masses(priorities))

    def sample(self, n: int, rng: np.random.Generator) -> tuple[Slots, Floats]:
        """``n`` independent draws by priority (uniform when every priority is 0)."""
        total = self._tree.total
        if total <= 0.0:
            return self._members.sample(n, rng)
        slots = self._tree.find(rng.random(n) * total)
        return slots, self._tree.get(slots) / total

    def draw_mass(self) -> float:
        """``Σ p^alpha`` over the items held; 0 when draws fall back to uniform."""
        return float(self._tree.total)

    def weights(self, probabilities: Floats, size: int) -> Floats:
        """``(size · P(i))^-beta``, normalised by the batch's largest weight.

        Computed as ``(P_min / P(i))^beta``, the same number: a ratio of at most 1 raised to
        beta cannot overflow, where ``(size · P)^-beta`` is infinite for a large beta and a
        small probability, and the normalised weight then NaN.
        """
        probs = np.asarray(probabilities, dtype=np.float64)
        # a probability that underflowed to 0 is the batch's least likely pick: weight 1
        ratio = np.divide(probs.min(), probs, out=np.ones_like(probs), where=probs > 0)
        return np.asarray(ratio**self._is_exponent, dtype=np.float64)

    def __len__(self) -> int:
        """Number of slots held."""
        return len(self._members)

    def index_bytes(self) -> int:
        """The sum tree plus the membership set used for the all-zero fallback."""
        return self._tree.nbytes + self._members.index_bytes()
