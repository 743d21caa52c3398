"""Sets of names kept per slot as bits: the fields an item's value has, the tasks that
acknowledged it (see :mod:`rlreplay.app.tables.rollouts`).

:class:`Names` numbers names in the order first seen, without a limit; a set of them is a
*mask*, a Python int with bit ``i`` for the name numbered ``i``. :class:`SlotMasks` keeps one
mask per slot of a table: the bits of the first 64 names in one of the table's ``uint64``
columns (dense, read by a claim's walk at NumPy speed), the bits of later names in a dict by
slot, holding only the slots that have some. So a table whose values have 64 top-level
fields or fewer (the common case) pays one word per slot, and a name past the 64th costs
only the items that hold it, however many names the table has seen.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["LOW_BITS", "Names", "SlotMasks"]

#: Names whose bits a table's dense column holds.
LOW_BITS = 64
#: The bits of the dense column, in a mask.
LOW = (1 << LOW_BITS) - 1


class Names:
    """Names numbered in the order first seen, without a limit."""

    def __init__(self) -> None:
        self.positions: dict[str, int] = {}
        self._order: list[str] = []

    def __len__(self) -> int:
        return len(self._order)

    def bit(self, name: str) -> int:
        """The mask of ``name`` alone, numbering it now if it is new."""
        pos = self.positions.get(name)
        if pos is None:
            pos = self.positions[name] = len(self._order)
            self._order.append(name)
        return 1 << pos

    def known(self, name: str) -> int | None:
        """The mask of ``name`` alone if it is numbered (None: never seen)."""
        pos = self.positions.get(name)
        return None if pos is None else 1 << pos

    def mask(self, names: Iterable[str]) -> int:
        """The mask of ``names``, numbering the new ones."""
        mask = 0
        positions = self.positions
        for name in names:
            pos = positions.get(name)
            mask |= self.bit(name) if pos is None else 1 << pos
        return mask

    def known_mask(self, names: Iterable[str]) -> int | None:
        """The mask of ``names`` if every one is numbered (None: one never seen)."""
        mask = 0
        positions = self.positions
        for name in names:
            pos = positions.get(name)
            if pos is None:
                return None
            mask |= 1 << pos
        return mask

    def names(self, mask: int) -> list[str]:
        """The names in ``mask``, in the order they were numbered."""
        order = self._order
        out: list[str] = []
        while mask:
            low = mask & -mask
            out.append(order[low.bit_length() - 1])
            mask ^= low
        return out


class SlotMasks:
    """A mask per slot of ``table``: the low bits in its column ``column`` (which the table
    grows with its other columns), the others in :attr:`high` (see the module docstring)."""

    def __init__(self, table: Any, column: str) -> None:
        self._table = table
        self._column = column
        #: slot → the bits past :data:`LOW_BITS` of its mask (slots with none are absent).
        self.high: dict[int, int] = {}

    @property
    def low(self) -> npt.NDArray[np.uint64]:
        """The dense column of the low bits."""
        column: npt.NDArray[np.uint64] = getattr(self._table, self._column)
        return column

    def get(self, slot: int) -> int:
        """The mask of ``slot``."""
        mask = int(self.low[slot])
        return mask | self.high[slot] if self.high and slot in self.high else mask

    def get_many(self, slots: Any) -> list[int]:
        """The masks of ``slots`` (a list or an array of slots)."""
        masks: list[int] = self.low[slots].tolist()
        high = self.high
        if high:
            for i, slot in enumerate(np.asarray(slots).tolist()):
                more = high.get(slot)
                if more:
                    masks[i] |= more
        return masks

    def set(self, slot: int, mask: int) -> None:
        """Set the mask of ``slot``."""
        self.low[slot] = mask & LOW
        if mask > LOW:
            self.high[slot] = mask & ~LOW
        elif self.high:
            self.high.pop(slot, None)

    def set_many(self, slots: npt.NDArray[np.int64], masks: list[int]) -> None:
        """Set the masks of distinct ``slots``."""
        if self.high or (masks and max(masks) > LOW):
            for slot, mask in zip(slots.tolist(), masks, strict=True):
                self.set(slot, mask)
        else:
            self.low[slots] = masks

    def clear(self, slots: npt.NDArray[np.int64], slot_list: list[int]) -> None:
        """Empty the masks of ``slots`` (the same as ``slot_list``)."""
        self.low[slots] = 0
        if self.high:
            for slot in slot_list:
                self.high.pop(slot, None)

    def add(self, slots: npt.NDArray[np.int64], bit: int) -> None:
        """Add the one-name mask ``bit`` to the masks of distinct ``slots``."""
        if bit <= LOW:
            self.low[slots] |= np.uint64(bit)
            return
        high = self.high
        for slot in slots.tolist():
            high[slot] = high.get(slot, 0) | bit

    def lacking(self, n: int, bit: int) -> npt.NDArray[np.bool_]:
        """Whether each of the first ``n`` slots' masks lacks the one-name mask ``bit``."""
        if bit <= LOW:
            lacks: npt.NDArray[np.bool_] = (self.low[:n] & np.uint64(bit)) == 0
            return lacks
        lacks = np.ones(n, dtype=bool)
        for slot, more in self.high.items():
            if more & bit and slot < n:
                lacks[slot] = False
        return lacks

    def empty(self, n: int) -> npt.NDArray[np.bool_]:
        """Whether each of the first ``n`` slots' masks is empty."""
        empty: npt.NDArray[np.bool_] = self.low[:n] == 0
        for slot in self.high:
            if slot < n:
                empty[slot] = False
        return empty
