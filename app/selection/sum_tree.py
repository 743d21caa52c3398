"""A float64 sum tree over slots with batched updates and a vectorised search."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.selection.base import Floats, Slots

# Below this many changed leaves a plain Python walk up the tree beats numpy's per-call cost.
_SCALAR_UPDATE_MAX = 4


class SumTree:
    """A complete binary tree whose leaves are per-slot masses and whose nodes hold sums.

    Node ``1`` is the root, node ``i`` has children ``2i`` and ``2i + 1``, and slot ``s``
    is leaf ``capacity + s``. Every internal node is recomputed from its two children
    whenever a leaf below it changes (never adjusted by a difference), so rounding does
    not accumulate however many updates are made. Everything is float64.

    ``find`` walks all queries down the tree together, one numpy step per level, so a
    batch of draws costs O(log n) numpy calls whatever its size. It never lands on a
    leaf of mass 0: at each node it enters a child only if that child's sum is positive.
    """

    def __init__(self, capacity: int = 1024) -> None:
        """Creates an empty tree.

        Args:
            capacity: slots to allocate up front; rounded up to a power of two.
        """
        self._capacity = 1 << max(4, (capacity - 1).bit_length())
        self._tree: Floats = np.zeros(2 * self._capacity, dtype=np.float64)

    @property
    def capacity(self) -> int:
        """Slots the tree holds without growing."""
        return self._capacity

    @property
    def total(self) -> float:
        """The sum of every leaf."""
        return float(self._tree[1])

    @property
    def nbytes(self) -> int:
        """Bytes of the node array."""
        return int(self._tree.nbytes)

    @property
    def leaves(self) -> Floats:
        """A writable view of the leaves, indexed by slot; call ``rebuild`` after writing."""
        return self._tree[self._capacity :]

    def get(self, slots: Slots) -> Floats:
        """The leaf masses of ``slots`` (0 where never set)."""
        return self._tree[self._capacity + slots]

    def set(self, slots: Slots, masses: Floats) -> None:
        """Sets the leaves of ``slots`` to ``masses`` and refreshes the sums above them.

        Args:
            slots: the slots to change; with repeats, the last mass given wins.
            masses: non-negative finite masses, one per slot.
        """
        if len(slots) == 0:
            return
        self._ensure_capacity(int(slots.max()) + 1)
        cap, tree = self._capacity, self._tree
        nodes = slots + cap
        tree[nodes] = masses
        if len(slots) <= _SCALAR_UPDATE_MAX:
            for node in nodes.tolist():
                node >>= 1
                while node:
                    tree[node] = tree[2 * node] + tree[2 * node + 1]
                    node >>= 1
        elif len(slots) * 8 >= cap:
            self.rebuild()
        else:
            nodes >>= 1
            while nodes[0]:
                tree[nodes] = tree[2 * nodes] + tree[2 * nodes + 1]
                nodes >>= 1

    def rebuild(self) -> None:
        """Recomputes every internal node from the leaves, one vectorised pass per level."""
        tree = self._tree
        lo = self._capacity // 2
        while lo:
            tree[lo : 2 * lo] = tree[2 * lo : 4 * lo : 2] + tree[2 * lo + 1 : 4 * lo : 2]
            lo //= 2

    def find(self, targets: Floats) -> Slots:
        """For each target ``t`` in ``[0, total)``, the slot whose leaf covers ``t``.

        The leaves, taken in slot order, tile ``[0, total)`` with intervals as wide as their
        masses; the slot returned is the one whose interval contains ``t``. Requires
        ``total > 0``; never returns a slot of mass 0, even when rounding puts ``t`` at an
        interval's edge.

        Args:
            targets: points in ``[0, total)``.

        Returns:
            One slot per target.
        """
        tree = self._tree
        rest = np.array(targets, dtype=np.float64)
        nodes: npt.NDArray[np.int64] = np.ones(len(rest), dtype=np.int64)
        level = self._capacity
        while level > 1:
            left_nodes = nodes << 1
            left = tree[left_nodes]
            right = tree[left_nodes + 1]
            go_right = ((rest >= left) & (right > 0.0)) | (left <= 0.0)
            rest -= np.where(go_right, left, 0.0)
            nodes = left_nodes + go_right
            level >>= 1
        return nodes - self._capacity

    def _ensure_capacity(self, length: int) -> None:
        if length <= self._capacity:
            return
        capacity = 1 << (length - 1).bit_length()
        tree = np.zeros(2 * capacity, dtype=np.float64)
        tree[capacity : capacity + self._capacity] = self.leaves
        self._capacity, self._tree = capacity, tree
        self.rebuild()
