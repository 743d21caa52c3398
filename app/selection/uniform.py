"""Uniform selection: every item equally likely."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.app.selection.base import Floats, Selector, Slots
from rlreplay.app.selection.slot_array import grown

#: Removals of up to this many slots take the per-slot loop (cheaper than numpy's set-up).
_LOOP_AT_MOST = 4


class UniformSampler(Selector):
    """Every held item equally likely: P(i) = 1/N.

    The slots held are packed at the front of a dense array, and a per-slot array records
    where each one sits. A removal moves the last packed slot into the hole (swap-remove),
    so insert, remove and pick are O(1) each, and a pick is one random index. As a remover
    it evicts a uniformly random item.
    """

    name = "uniform"

    def __init__(self) -> None:
        """Creates an empty selector; uniform takes no parameters."""
        self._dense = np.empty(1024, dtype=np.int64)
        self._pos = np.full(1024, -1, dtype=np.int64)
        self._n = 0

    @property
    def slots(self) -> Slots:
        """The slots held, in no particular order (a view: copy it before changing anything)."""
        return self._dense[: self._n]

    def insert(
        self,
        slots: Slots,
        priorities: Floats,
        inserted_at: Floats,
        fields: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Adds ``slots``; priorities, times and fields do not matter here."""
        k = len(slots)
        if k == 0:
            return
        self._pos = grown(self._pos, int(slots.max()) + 1, -1)
        self._dense = grown(self._dense, self._n + k, 0)
        self._dense[self._n : self._n + k] = slots
        self._pos[slots] = np.arange(self._n, self._n + k)
        self._n += k

    def remove(self, slots: Slots) -> None:
        """Drops ``slots`` (distinct, all held), filling the holes with packed slots from the end.

        A batch is done with numpy: the slots left in the tail (the last ``len(slots)``
        places) move into the holes below it, so the cost does not grow with a Python loop
        per slot.
        """
        dense, pos = self._dense, self._pos
        if len(slots) > _LOOP_AT_MOST:
            n = self._n
            keep = n - len(slots)
            where = pos[slots]
            holes = where[where < keep]
            pos[slots] = -1
            tail = dense[keep:n]
            movers = tail[pos[tail] >= 0]
            dense[holes] = movers
            pos[movers] = holes
            self._n = keep
            return
        for slot in slots.tolist():
            hole = int(pos[slot])
            last = self._n - 1
            moved = int(dense[last])
            dense[hole] = moved
            pos[moved] = hole
            pos[slot] = -1
            self._n = last

    def update(self, slots: Slots, priorities: Floats) -> None:
        """Priorities do not matter to a uniform choice."""
        return None

    def sample(self, n: int, rng: np.random.Generator) -> tuple[Slots, Floats]:
        """``n`` independent uniform picks, each of probability ``1/N``."""
        picks = rng.integers(0, self._n, size=n)
        return self._dense[picks], np.full(n, 1.0 / self._n)

    def evict(self, k: int, rng: np.random.Generator) -> Slots:
        """``k`` distinct items, uniformly at random, then dropped."""
        picked = self._dense[rng.choice(self._n, size=k, replace=False)].copy()
        self.remove(picked)
        return picked

    def __len__(self) -> int:
        """Number of slots held."""
        return self._n

    def index_bytes(self) -> int:
        """The dense array and the position of each slot."""
        return int(self._dense.nbytes + self._pos.nbytes)
