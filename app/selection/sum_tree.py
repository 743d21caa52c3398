"""A float64 sum tree over slots with batched updates and a vectorised search."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from rlreplay.app.selection.base import Floats, Slots

# Nodes in the tree's "jump" level: above it no node is stored; a prefix sum over this
# level (recomputed lazily, a few microseconds) replaces the top of the tree, so a search
# starts with one binary search and an update stops this many levels below the root.
JUMP_NODES = 4096
# Below this many changed leaves a plain Python walk up the tree beats numpy's per-call cost.
_SCALAR_UPDATE_MAX = 4


class SumTree:
    """Per-slot masses in a complete binary tree whose nodes hold the sums below them.

    Node ``i`` has children ``2i`` and ``2i + 1``, and slot ``s`` is leaf ``capacity + s``.
    Only the levels from the *jump level* (nodes ``[jump, 2·jump)``) down are kept; the
    root and the levels above are replaced by the prefix sums of the jump level, computed
    once after each change, when next needed. Every node is recomputed from its children
    (never adjusted by a difference), so rounding does not accumulate over updates.
    Everything is float64.

    ``find`` handles a whole batch of draws together: one ``searchsorted`` over the prefix
    sums, then one numpy step per level below the jump level. It never returns a leaf of
    mass 0: the rare draw that rounding puts on one is walked again with a guarded descent.
    """

    def __init__(self, capacity: int = 1024, *, jump_nodes: int = JUMP_NODES) -> None:
        """Creates an empty tree.

        Args:
            capacity: slots to allocate up front; rounded up to a power of two.
            jump_nodes: nodes of the jump level (a power of two; 1 keeps the whole tree).
        """
        if jump_nodes < 1 or jump_nodes & (jump_nodes - 1):
            raise ValueError(f"jump_nodes ({jump_nodes}) must be a power of two")
        self._jump_nodes = jump_nodes
        self._capacity = 1 << max(4, (capacity - 1).bit_length())
        self._tree: Floats = np.zeros(2 * self._capacity, dtype=np.float64)
        self._prefix: Floats | None = None

    @property
    def capacity(self) -> int:
        """Slots the tree holds without growing."""
        return self._capacity

    @property
    def _jump(self) -> int:
        return min(self._capacity, self._jump_nodes)

    def _prefixes(self) -> Floats:
        """``[0, s0, s0+s1, ...]`` over the jump level: the cumulative masses of its nodes."""
        if self._prefix is None:
            jump = self._jump
            prefix = np.empty(jump + 1, dtype=np.float64)
            prefix[0] = 0.0
            np.cumsum(self._tree[jump : 2 * jump], out=prefix[1:])
            self._prefix = prefix
        return self._prefix

    @property
    def total(self) -> float:
        """The sum of every leaf."""
        return float(self._prefixes()[-1])

    @property
    def nbytes(self) -> int:
        """Bytes of the node array and the prefix sums."""
        return int(self._tree.nbytes) + 8 * (self._jump + 1)

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
        cap, jump, tree = self._capacity, self._jump, self._tree
        self._prefix = None
        nodes = slots + cap
        tree[nodes] = masses
        if len(slots) <= _SCALAR_UPDATE_MAX:
            for node in nodes.tolist():
                node >>= 1
                while node >= jump:
                    tree[node] = tree[2 * node] + tree[2 * node + 1]
                    node >>= 1
        elif len(slots) * 8 >= cap:
            self.rebuild()
        else:
            nodes >>= 1
            while nodes[0] >= jump:
                left = nodes << 1
                tree[nodes] = tree[left] + tree[left + 1]
                nodes >>= 1

    def rebuild(self) -> None:
        """Recomputes every stored node from the leaves, one vectorised pass per level."""
        tree = self._tree
        lo = self._capacity // 2
        while lo >= self._jump:
            tree[lo : 2 * lo] = tree[2 * lo : 4 * lo : 2] + tree[2 * lo + 1 : 4 * lo : 2]
            lo //= 2
        self._prefix = None

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
        tree, cap, jump = self._tree, self._capacity, self._jump
        prefix = self._prefixes()
        rest = np.array(targets, dtype=np.float64)
        # The first jump-level node whose cumulative mass passes t has a positive mass.
        idx = np.searchsorted(prefix, rest, side="right")
        np.clip(idx, 1, jump, out=idx)
        rest -= prefix[idx - 1]
        nodes: npt.NDArray[np.int64] = idx + (jump - 1)
        level = jump
        while level < cap:
            nodes <<= 1
            left = tree[nodes]
            go_right = rest >= left
            np.subtract(rest, left, out=rest, where=go_right)
            nodes += go_right
            level <<= 1
        zero = tree[nodes] <= 0.0
        if zero.any():  # rounding put these draws on an empty leaf: walk them again, guarded
            nodes[zero] = self._find_guarded(np.asarray(targets, dtype=np.float64)[zero])
        return nodes - cap

    def _find_guarded(self, targets: Floats) -> npt.NDArray[np.int64]:
        """Leaf nodes for ``targets``, entering a child only if its sum is positive."""
        tree, cap, jump = self._tree, self._capacity, self._jump
        prefix = self._prefixes()
        masses = tree[jump : 2 * jump]
        positive = np.flatnonzero(masses > 0.0)
        idx = np.searchsorted(prefix, targets, side="right") - 1
        # snap to the nearest jump-level node with mass, from the left
        pos = np.clip(np.searchsorted(positive, idx, side="right") - 1, 0, len(positive) - 1)
        idx = positive[pos]
        rest = np.clip(targets - prefix[idx], 0.0, None)
        nodes = idx + jump
        level = jump
        while level < cap:
            left_nodes = nodes << 1
            left = tree[left_nodes]
            right = tree[left_nodes + 1]
            go_right = ((rest >= left) & (right > 0.0)) | (left <= 0.0)
            rest -= np.where(go_right, left, 0.0)
            nodes = left_nodes + go_right
            level <<= 1
        return nodes

    def _ensure_capacity(self, length: int) -> None:
        if length <= self._capacity:
            return
        old_leaves = self.leaves
        capacity = 1 << (length - 1).bit_length()
        tree = np.zeros(2 * capacity, dtype=np.float64)
        tree[capacity : capacity + self._capacity] = old_leaves
        self._capacity, self._tree = capacity, tree
        self.rebuild()
