"""Recently decompressed chunks, so that overlapping windows decompress a chunk once.

Bounded by bytes; least recently used first out. Chunks are immutable once sealed, so an
entry never goes stale: a chunk's key names its episode's storage (never reused) and its
field and number, and a deleted episode's entries simply age out.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

__all__ = ["ChunkCache"]

#: The default bound: a few windows of a batch of Atari-sized frames.
DEFAULT_CACHE_BYTES = 64 * 2**20


class ChunkCache:
    """An LRU map of ``(storage id, field, chunk)`` to a decompressed chunk's array."""

    def __init__(self, limit_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[int, str, int], np.ndarray[Any, Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[int, str, int]) -> np.ndarray[Any, Any] | None:
        """The cached array of ``key`` (marked recently used), or None."""
        array = self._entries.get(key)
        if array is not None:
            self._entries.move_to_end(key)
        return array

    def put(self, key: tuple[int, str, int], array: np.ndarray[Any, Any]) -> None:
        """Keep ``array`` (read-only) under ``key``, dropping the oldest past the bound."""
        if array.nbytes > self.limit_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        self._entries[key] = array
        self.bytes += array.nbytes
        while self.bytes > self.limit_bytes:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= dropped.nbytes

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()
        self.bytes = 0
