"""Heap selectors: always the item of highest (or lowest) priority."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from rlreplay.app.selection.base import Floats, Selector, Slots
from rlreplay.app.selection.tournament_tree import TournamentTree


class _HeapSelector(Selector):
    """The item whose priority is best, ties going to the least recently inserted or updated.

    Backed by a :class:`TournamentTree` keyed by ``sign · priority``: a pick is O(1) and
    a batch of changes one O(log n) vectorised replay. The tie rule is Reverb's: among
    equal priorities the item inserted or last updated earliest comes first, so a heap
    of equal priorities behaves like FIFO.
    """

    deterministic = True
    _sign: ClassVar[float] = 1.0

    def __init__(self) -> None:
        """Creates an empty selector; it takes no parameters."""
        self._tree = TournamentTree()
        self._next_tie = 0

    def _tickets(self, k: int) -> Any:
        tickets = np.arange(self._next_tie, self._next_tie + k, dtype=np.int64)
        self._next_tie += k
        return tickets

    def insert(
        self,
        slots: Slots,
        priorities: Floats,
        inserted_at: Floats,
        fields: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Adds ``slots`` with their priorities; earlier in the batch wins ties."""
        self._tree.put(
            slots, self._sign * np.asarray(priorities, dtype=np.float64), self._tickets(len(slots))
        )

    def remove(self, slots: Slots) -> None:
        """Drops ``slots``."""
        self._tree.drop(slots)

    def update(self, slots: Slots, priorities: Floats) -> None:
        """New priorities; an updated item goes behind others of equal priority."""
        self._tree.put(
            slots, self._sign * np.asarray(priorities, dtype=np.float64), self._tickets(len(slots))
        )

    def place(self, slots: Slots) -> Any:
        """Their tie numbers: their turn among equal priorities."""
        return self._tree.ties(slots)

    def put_back(
        self,
        slots: Slots,
        priorities: Floats,
        inserted_at: Floats,
        fields: Sequence[Mapping[str, Any]] | None,
        place: Any,
    ) -> None:
        """Back with their tie numbers, so they keep their turn among equal priorities."""
        self._tree.put(slots, self._sign * np.asarray(priorities, dtype=np.float64), place)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[Slots, Floats]:
        """The best slot, ``n`` times, with probability 1."""
        return np.full(n, self._tree.best(), dtype=np.int64), np.ones(n)

    def evict(self, k: int, rng: np.random.Generator) -> Slots:
        """The ``k`` best items, best first, then dropped."""
        picked = np.empty(k, dtype=np.int64)
        for i in range(k):
            picked[i] = self._tree.best()
            self._tree.drop(picked[i : i + 1])
        return picked

    def __len__(self) -> int:
        """Number of slots held."""
        return len(self._tree)

    def index_bytes(self) -> int:
        """The tournament tree."""
        return self._tree.nbytes


class MaxHeapSelector(_HeapSelector):
    """Always the item of highest priority (a priority queue).

    As a remover it evicts the highest priority first, keeping the lowest.
    """

    name = "max_heap"
    _sign = 1.0


class MinHeapSelector(_HeapSelector):
    """Always the item of lowest priority.

    As a remover it evicts the lowest priority first, so a bounded table keeps the
    highest-priority items seen over a long span.
    """

    name = "min_heap"
    _sign = -1.0
