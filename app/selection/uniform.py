"""Uniform selection: every item equally likely."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.selection.base import Floats, Selector, Slots


class UniformSampler(Selector):
    """Uniform over the items held: a dense array of slots with swap-remove, O(1) per change."""

    name = "uniform"

    def __init__(self) -> None:
        self._dense = np.empty(1024, dtype=np.int64)
        self._pos = np.full(1024, -1, dtype=np.int64)
        self._n = 0

    def _grow_pos(self, top: int) -> None:
        if top >= len(self._pos):
            new = np.full(max(top + 1, 2 * len(self._pos)), -1, dtype=np.int64)
            new[: len(self._pos)] = self._pos
            self._pos = new

    def insert(
        self,
        slots: Slots,
        priorities: Floats,
        inserted_at: Floats,
        fields: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        k = len(slots)
        if k == 0:
            return
        self._grow_pos(int(slots.max()))
        if self._n + k > len(self._dense):
            new = np.empty(max(self._n + k, 2 * len(self._dense)), dtype=np.int64)
            new[: self._n] = self._dense[: self._n]
            self._dense = new
        self._dense[self._n : self._n + k] = slots
        self._pos[slots] = np.arange(self._n, self._n + k)
        self._n += k

    def remove(self, slots: Slots) -> None:
        dense, pos = self._dense, self._pos
        for slot in slots.tolist():
            i = int(pos[slot])
            last = self._n - 1
            moved = int(dense[last])
            dense[i] = moved
            pos[moved] = i
            pos[slot] = -1
            self._n = last

    def update(self, slots: Slots, priorities: Floats) -> None:
        return None

    def sample(self, n: int, rng: np.random.Generator) -> tuple[Slots, Floats]:
        idx = rng.integers(0, self._n, size=n)
        return self._dense[idx], np.full(n, 1.0 / self._n)

    def __len__(self) -> int:
        return self._n

    def index_bytes(self) -> int:
        return int(self._dense.nbytes + self._pos.nbytes)
