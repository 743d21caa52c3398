"""Sets of names kept per slot as bits: the fields an item's value has, the tasks that
acknowledged it (see :mod:`rlreplay.app.tables.rollouts`).

:class:`Names` numbers names in the order first seen, without a limit; a set of them is a
*mask*, a Python int with bit ``i`` for the name numbered ``i``. A table keeps one mask per
slot in a 2-D ``uint64`` column, one row per slot and one word per 64 names: the column
gains a word each time a 65th, 129th... name is numbered, so it costs one bit per slot and
name. The helpers below move masks in and out of such columns; a column of one word (64
names or fewer, the common case) is read and written as the 1-D view of that word.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "WORD_BITS",
    "Names",
    "mask_of_row",
    "row_mask",
    "row_masks",
    "set_row",
    "set_rows",
    "widened",
    "word_masks",
]

#: Names per word of a mask column.
WORD_BITS = 64
_WORD = (1 << WORD_BITS) - 1

MaskColumn = npt.NDArray[np.uint64]


class Names:
    """Names numbered in the order first seen, without a limit.

    Args:
        widen: Called with the number of words masks now need, each time a name is
            numbered past what the current words hold (the owner widens its columns).
    """

    def __init__(self, widen: Callable[[int], None] | None = None) -> None:
        self.positions: dict[str, int] = {}
        self._order: list[str] = []
        self._widen = widen
        #: The words a mask of every name numbered so far needs.
        self.words = 1

    def __len__(self) -> int:
        return len(self._order)

    def bit(self, name: str) -> int:
        """The mask of ``name`` alone, numbering it now if it is new."""
        pos = self.positions.get(name)
        if pos is None:
            pos = self.positions[name] = len(self._order)
            self._order.append(name)
            if pos >= self.words * WORD_BITS:
                self.words += 1
                if self._widen is not None:
                    self._widen(self.words)
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

    def names(self, mask: int) -> list[str]:
        """The names in ``mask``, in the order they were numbered."""
        order = self._order
        out: list[str] = []
        while mask:
            low = mask & -mask
            out.append(order[low.bit_length() - 1])
            mask ^= low
        return out


def widened(column: MaskColumn, words: int) -> MaskColumn:
    """``column`` with ``words`` words per row (the new ones zero)."""
    new = np.zeros((len(column), words), dtype=np.uint64)
    new[:, : column.shape[1]] = column
    return new


def _words(mask: int, words: int) -> list[int]:
    return [(mask >> (WORD_BITS * w)) & _WORD for w in range(words)]


def mask_of_row(row: Sequence[Any]) -> int:
    """The mask a row of words holds."""
    mask = 0
    for w, word in enumerate(row):
        if word:
            mask |= int(word) << (WORD_BITS * w)
    return mask


def row_mask(column: MaskColumn, slot: int) -> int:
    """The mask the row of ``slot`` holds."""
    if column.shape[1] == 1:
        return int(column[slot, 0])
    return mask_of_row(column[slot].tolist())


def set_row(column: MaskColumn, slot: int, mask: int) -> None:
    """Store ``mask`` in the row of ``slot`` (it fits the column's words)."""
    words = column.shape[1]
    if words == 1:
        column[slot, 0] = mask
    else:
        column[slot] = _words(mask, words)


def set_rows(column: MaskColumn, slots: Any, masks: list[int]) -> None:
    """Store ``masks[i]`` in the row of ``slots[i]`` (a mask fits the column's words)."""
    words = column.shape[1]
    if words == 1:
        column[slots, 0] = masks
    else:
        column[slots] = [_words(mask, words) for mask in masks]


def row_masks(column: MaskColumn, slots: Any) -> list[int]:
    """The masks the rows of ``slots`` hold."""
    if column.shape[1] == 1:
        masks: list[int] = column[slots, 0].tolist()
        return masks
    return [mask_of_row(row) for row in column[slots].tolist()]


def word_masks(mask: int) -> list[tuple[int, np.uint64]]:
    """``mask``'s nonzero words: (word index, its bits)."""
    out: list[tuple[int, np.uint64]] = []
    w = 0
    while mask:
        word = mask & _WORD
        if word:
            out.append((w, np.uint64(word)))
        mask >>= WORD_BITS
        w += 1
    return out
