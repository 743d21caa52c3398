"""Keeps the process's resident memory close to what the cache holds.

CPython allocates each large ``bytes`` (a value) with glibc's ``malloc``. Values evicted
from the cache leave holes in glibc's heaps, and every thread that reads from RocksDB
gets a heap (an *arena*) of its own, so resident memory drifts above what the cache
holds. Two measures, both glibc-only and harmless elsewhere:

- at most :data:`ARENA_MAX` arenas (``M_ARENA_MAX``), so the I/O threads share heaps;
- fixed thresholds: buffers up to :data:`MMAP_THRESHOLD` (request bodies, 1 MB sample
  answers) come from the heap, and glibc trims the heap's top only past
  :data:`TRIM_THRESHOLD`. With glibc's defaults, each request freed its body, the freed top
  was handed back to the OS, and the next request faulted it in again: 17 page faults per
  push of 64 x 4 KiB (measured), about a twentieth of its time;
- :func:`release_free_memory` (``malloc_trim``), which the writer calls after it has
  evicted a good amount, hands the free pages inside the heaps back to the OS.

The service's own process (``rlreplay serve``) also tunes Python's cyclic garbage
collector (:func:`tune_gc`): requests allocate many short-lived containers (an item object
per pushed item), and at the default threshold of 700 a young collection ran every one or
two requests, about 4% of the server's time under load (``perf``).

Lowering glibc's mmap threshold instead (each value its own mapping) bounds memory more
tightly but makes every large allocation, such as a 1 MB response, 20 times slower; we
measured that and chose not to. Figures are in ``tests/engine/test_memory.py``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from typing import Any

M_ARENA_MAX = -8
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
ARENA_MAX = 2
#: Allocations at least this large get their own mapping.
MMAP_THRESHOLD = 4 << 20
#: Free bytes at the heap's top that glibc keeps rather than trims (malloc_trim still does).
TRIM_THRESHOLD = 32 << 20
#: Young-generation threshold of the serving process (Python's default is 700).
GC_YOUNG_THRESHOLD = 20_000

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
    """Cap glibc's arenas and fix its thresholds; False where the C library is not glibc."""
    lib = _glibc()
    if not lib:
        return False
    ok = bool(lib.mallopt(M_ARENA_MAX, ARENA_MAX))
    ok &= bool(lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return ok & bool(lib.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def release_free_memory() -> None:
    """Return free heap pages to the OS (blocking, a few milliseconds at most)."""
    lib = _glibc()
    if lib:
        lib.malloc_trim(0)


def tune_gc(*, freeze: bool = False) -> None:
    """Raise the young collection threshold; with ``freeze``, set what exists now aside.

    Call it with ``freeze=True`` once start-up (recovery) is done: the objects alive then
    (modules, the tables' indexes) move to the permanent generation, so full collections
    no longer walk them.
    """
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)
    if freeze:
        gc.collect()
        gc.freeze()
