"""A winner tree over slots: the best slot by ``(key, tie)`` in O(1), changes in O(log n)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from rlreplay.app.selection.base import Floats, Slots
from rlreplay.app.selection.slot_array import grown

# Below this many changed leaves a plain Python walk up the tree beats numpy's per-call cost.
_SCALAR_UPDATE_MAX = 4
_NEVER = np.iinfo(np.int64).max


class TournamentTree:
    """A complete binary tree in which each node holds the winner of the slots below it.

    A slot beats another when its key is larger, or the keys are equal and its tie number
    is smaller. Each node stores the *winning entry* of its two children, so the root
    names the best slot of all in O(1); changing ``k`` leaves replays only the matches on
    their paths to the root, one vectorised step per level (a plain Python walk when ``k``
    is tiny). Unlike a binary heap with lazy deletion, memory stays fixed per slot and
    updates need no garbage collection.

    Entries are ``slot + 1``, stored as int32 (so slots stay below 2^31 - 1); entry 0 is
    the empty leaf, whose key is ``-inf`` and tie number the largest int64, so it loses to
    any slot held, even one of key ``-inf``.
    """

    def __init__(self, capacity: int = 1024) -> None:
        """Creates an empty tree.

        Args:
            capacity: slots to allocate up front; rounded up to a power of two.
        """
        self._capacity = 1 << max(4, (capacity - 1).bit_length())
        self._winners: npt.NDArray[np.int32] = np.zeros(2 * self._capacity, dtype=np.int32)
        self._keys: Floats = np.full(self._capacity + 1, -np.inf)
        self._ties: npt.NDArray[np.int64] = np.full(self._capacity + 1, _NEVER, dtype=np.int64)
        self._size = 0

    def __len__(self) -> int:
        """Number of slots held."""
        return self._size

    @property
    def nbytes(self) -> int:
        """Bytes of the winners, keys and tie numbers."""
        return int(self._winners.nbytes + self._keys.nbytes + self._ties.nbytes)

    def best(self) -> int:
        """The winning slot; requires a non-empty tree."""
        return int(self._winners[1]) - 1

    def held(self, slots: Slots) -> npt.NDArray[np.bool_]:
        """Whether each of ``slots`` is held."""
        leaves = self._capacity + slots
        inside = slots < self._capacity
        result = np.zeros(len(slots), dtype=bool)
        result[inside] = self._winners[leaves[inside]] != 0
        return result

    def ties(self, slots: Slots) -> npt.NDArray[np.int64]:
        """The tie numbers of held ``slots``."""
        ties: npt.NDArray[np.int64] = self._ties[slots + 1].copy()
        return ties

    def put(self, slots: Slots, keys: Floats, ties: npt.NDArray[np.int64]) -> None:
        """Holds ``slots`` (new or not) with these keys and tie numbers; slots must be distinct."""
        if len(slots) == 0:
            return
        self._ensure_capacity(int(slots.max()) + 1)
        self._size += len(slots) - int(np.count_nonzero(self.held(slots)))
        self._keys[slots + 1] = keys
        self._ties[slots + 1] = ties
        self._replay(slots, slots + 1)

    def drop(self, slots: Slots) -> None:
        """Forgets ``slots``; each must be held, and they must be distinct."""
        if len(slots) == 0:
            return
        self._size -= len(slots)
        self._keys[slots + 1] = -np.inf
        self._ties[slots + 1] = _NEVER
        self._replay(slots, np.zeros(len(slots), dtype=np.int64))

    def _replay(self, slots: Slots, entries: npt.NDArray[np.int64]) -> None:
        """Sets the leaves of ``slots`` to ``entries`` and replays the matches above them."""
        winners, keys, ties = self._winners, self._keys, self._ties
        nodes = slots + self._capacity
        winners[nodes] = entries
        if len(slots) <= _SCALAR_UPDATE_MAX:
            for node in nodes.tolist():
                node >>= 1
                while node:
                    left, right = winners[2 * node], winners[2 * node + 1]
                    key_l, key_r = keys[left], keys[right]
                    left_wins = key_l > key_r or (key_l == key_r and ties[left] < ties[right])
                    winners[node] = left if left_wins else right
                    node >>= 1
            return
        if len(slots) * 8 >= self._capacity:
            self._rebuild()
            return
        nodes >>= 1
        while nodes[0]:
            self._match(nodes, nodes << 1)
            nodes >>= 1

    def _match(self, nodes: npt.NDArray[np.int64], left_nodes: npt.NDArray[np.int64]) -> None:
        """Sets each node's winner from its two children (``left_nodes`` and the next ones)."""
        winners, keys, ties = self._winners, self._keys, self._ties
        left, right = winners[left_nodes], winners[left_nodes + 1]
        key_l, key_r = keys[left], keys[right]
        left_wins = (key_l > key_r) | ((key_l == key_r) & (ties[left] < ties[right]))
        winners[nodes] = np.where(left_wins, left, right)

    def _rebuild(self) -> None:
        lo = self._capacity // 2
        while lo:
            nodes = np.arange(lo, 2 * lo, dtype=np.int64)
            self._match(nodes, nodes << 1)
            lo //= 2

    def _ensure_capacity(self, length: int) -> None:
        if length <= self._capacity:
            return
        capacity = 1 << (length - 1).bit_length()
        winners = np.zeros(2 * capacity, dtype=np.int32)
        winners[capacity : capacity + self._capacity] = self._winners[self._capacity :]
        self._winners = winners
        self._keys = grown(self._keys, capacity + 1, -np.inf)
        self._ties = grown(self._ties, capacity + 1, _NEVER)
        self._capacity = capacity
        self._rebuild()
