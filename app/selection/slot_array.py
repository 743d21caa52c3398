"""Growing per-slot arrays: the storage every selector keeps, indexed by slot."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def grown(array: npt.NDArray[Any], length: int, fill: Any) -> npt.NDArray[Any]:
    """``array`` if it already has ``length`` entries, else a copy at least twice as long.

    New entries hold ``fill``; doubling keeps the amortised cost of growth O(1) per slot.

    Args:
        array: the current per-slot array.
        length: the number of entries needed (the largest slot plus one).
        fill: the value of the entries added.

    Returns:
        An array of at least ``length`` entries whose prefix is ``array``.
    """
    if length <= len(array):
        return array
    bigger = np.full(max(length, 2 * len(array), 16), fill, dtype=array.dtype)
    bigger[: len(array)] = array
    return bigger
