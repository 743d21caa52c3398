"""Keeps the process's resident memory close to what the cache holds.

CPython allocates each large ``bytes`` (a value) with glibc's ``malloc``. Values evicted
from the cache leave holes in glibc's heaps, and every thread that reads from RocksDB
gets a heap (an *arena*) of its own, so resident memory drifts above what the cache
holds. Three measures, all glibc-only and harmless elsewhere:

- at most :data:`ARENA_MAX` arenas (``M_ARENA_MAX``), so the I/O threads share heaps;
- fixed mmap and trim thresholds (:mod:`rlreplay.wire.allocator`, which the client uses too):
  with glibc's defaults each request freed its body, the freed heap top went back to the
  OS, and the next request faulted it in again (docs/benchmarks.md, "Per-request costs");
- :func:`release_free_memory` (``malloc_trim``), which the writer calls after it has
  evicted a good amount, hands the free pages inside the heaps back to the OS.

The service's own process (``rlreplay serve``) also tunes Python's cyclic garbage
collector (:func:`tune_gc`): requests allocate many short-lived containers (an item object
per pushed item), and at the default threshold of 700 a young collection ran every one or
two requests, a visible share of the server's time under load (``perf``).

Lowering glibc's mmap threshold instead (each value its own mapping) bounds memory more
tightly but makes every large allocation, such as a 1 MB response, many times slower; we
measured that and chose not to (docs/benchmarks.md, "Per-request costs").
"""

from __future__ import annotations

import gc

from rlreplay.wire.allocator import glibc, raise_malloc_thresholds

M_ARENA_MAX = -8
ARENA_MAX = 2
#: Young-generation threshold of the serving process (Python's default is 700).
GC_YOUNG_THRESHOLD = 20_000


def tune_allocator() -> bool:
    """Cap glibc's arenas and fix its thresholds; False where the C library is not glibc."""
    lib = glibc()
    if lib is None:
        return False
    return bool(lib.mallopt(M_ARENA_MAX, ARENA_MAX)) & raise_malloc_thresholds()


def release_free_memory() -> None:
    """Return free heap pages to the OS (blocking, a few milliseconds at most)."""
    lib = glibc()
    if lib is not None:
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
