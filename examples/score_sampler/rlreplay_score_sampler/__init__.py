"""An rlreplay sampler plugin: always the item whose value has the highest ``score``.

Installed, it is the sampler type ``score``::

    {"sampler": {"type": "score"}, "max_times_sampled": 1}

turns a table into a best-first work queue over ``value["score"]``.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.app.selection.base import Floats, Selector, Slots

__all__ = ["HighestScoreSampler"]

# Approximate bytes of one heap entry: the tuple, its float, two ints, and the list slot.
_ENTRY_BYTES = sys.getsizeof((0.0, 0, 0)) + sys.getsizeof(0.0) + 2 * sys.getsizeof(2**40) + 8


def score_of(fields: Mapping[str, Any] | None) -> float:
    """The ``score`` field as a float; ``-inf`` when missing, not a number, or NaN."""
    value = None if fields is None else fields.get("score")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return -math.inf
    score = float(value)
    return -math.inf if math.isnan(score) else score


class HighestScoreSampler(Selector):
    """Always the item whose value has the highest top-level ``score`` field.

    The engine reads the fields named in ``index_fields`` from each item's value when it
    is inserted and passes them to :meth:`insert`. An item whose value has no ``score``,
    or a ``score`` that is not a number (or is NaN), counts as ``-inf``: it is picked
    only when nothing scored remains. Among equal scores the item inserted first wins.
    Priorities are ignored; to re-rank an item, push its key again with a new score.

    The state is a binary heap (``heapq``) of ``(-score, ticket, slot)`` with lazy
    deletion: a removal forgets the slot's ticket, and stale entries are skipped when
    they reach the top. The heap is rebuilt when stale entries outnumber live ones, so
    each change is O(log n) amortised and memory stays proportional to the items held.
    """

    name = "score"
    index_fields = frozenset({"score"})
    deterministic = True

    def __init__(self) -> None:
        """Creates an empty sampler; it takes no parameters."""
        self._heap: list[tuple[float, int, int]] = []
        self._ticket_of: dict[int, int] = {}
        self._next_ticket = 0

    def insert(
        self,
        slots: Slots,
        priorities: Floats,
        inserted_at: Floats,
        fields: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Adds ``slots``; ``fields[i]`` holds the ``score`` of ``slots[i]`` if it has one."""
        for i, slot in enumerate(slots.tolist()):
            ticket = self._next_ticket
            self._next_ticket += 1
            self._ticket_of[slot] = ticket
            score = score_of(fields[i] if fields is not None else None)
            heapq.heappush(self._heap, (-score, ticket, slot))

    def remove(self, slots: Slots) -> None:
        """Drops ``slots``; their heap entries go stale."""
        for slot in slots.tolist():
            del self._ticket_of[slot]
        if len(self._heap) > 2 * len(self._ticket_of) + 64:
            self._heap = [entry for entry in self._heap if self._is_live(entry)]
            heapq.heapify(self._heap)

    def update(self, slots: Slots, priorities: Floats) -> None:
        """Priorities do not change the order (the score comes from the value)."""
        return None

    def sample(self, n: int, rng: np.random.Generator) -> tuple[Slots, Floats]:
        """The highest-scoring slot, ``n`` times, with probability 1."""
        heap = self._heap
        while not self._is_live(heap[0]):
            heapq.heappop(heap)
        return np.full(n, heap[0][2], dtype=np.int64), np.ones(n)

    def _is_live(self, entry: tuple[float, int, int]) -> bool:
        return self._ticket_of.get(entry[2]) == entry[1]

    def __len__(self) -> int:
        """Number of slots held."""
        return len(self._ticket_of)

    def index_bytes(self) -> int:
        """The heap's entries and the ticket of each slot held (estimated from their sizes)."""
        return (
            len(self._heap) * _ENTRY_BYTES
            + sys.getsizeof(self._ticket_of)
            + len(self._ticket_of) * 2 * sys.getsizeof(2**40)
        )
