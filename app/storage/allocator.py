"""Keeps the process's resident memory close to what the cache holds.

CPython allocates each large ``bytes`` (a value) with glibc's ``malloc``. Values evicted
from the cache leave holes in glibc's heaps, and every thread that reads from RocksDB
gets a heap (an *arena*) of its own, so resident memory drifts above what the cache
holds. Two measures, both glibc-only and harmless elsewhere:

- at most :data:`ARENA_MAX` arenas (``M_ARENA_MAX``), so the I/O threads share heaps;
- :func:`release_free_memory` (``malloc_trim``), which the writer calls after it has
  evicted a good amount, hands the free pages inside the heaps back to the OS.

Lowering glibc's mmap threshold instead (each value its own mapping) bounds memory more
tightly but makes every large allocation, such as a 1 MB response, 20 times slower; we
measured that and chose not to. Figures are in ``tests/engine/test_memory.py``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any

M_ARENA_MAX = -8
ARENA_MAX = 2

_libc: Any = None


def _glibc() -> Any:
    global _libc
    if _libc is None:
        _libc = False
        name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
        if name is not None:
            try:
                lib = ctypes.CDLL(name)
                if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim"):
                    _libc = lib
            except OSError:
                pass
    return _libc


def tune_allocator() -> bool:
    """Cap glibc's arenas for this process; False where the C library is not glibc."""
    lib = _glibc()
    return bool(lib) and bool(lib.mallopt(M_ARENA_MAX, ARENA_MAX))


def release_free_memory() -> None:
    """Return free heap pages to the OS (blocking, a few milliseconds at most)."""
    lib = _glibc()
    if lib:
        lib.malloc_trim(0)
