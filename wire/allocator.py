"""glibc's malloc thresholds, for processes that allocate and free buffers of a megabyte or
so per request: the server (request bodies, sample answers) and a client taking batches.

With glibc's defaults such a buffer is either a mapping of its own, or heap memory that
glibc hands back to the OS as soon as it is freed at the heap's top. Either way every
request faults its pages in again, a large share of a client's CPU per batch (count them in
``/proc/self/stat``; docs/benchmarks.md, "Per-request costs", has the figures). Fixed
thresholds end that:
buffers under :data:`MMAP_THRESHOLD` (glibc's largest, 32 MiB: the 4 MiB values a push
of columns is cut into among them) come from the heap, and the heap keeps up to
:data:`TRIM_THRESHOLD` of free memory at its top (``malloc_trim`` still returns it).

Only glibc has these knobs; elsewhere the functions do nothing and return False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "glibc", "raise_malloc_thresholds", "tune_malloc"]

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Allocations at least this large get their own mapping.
MMAP_THRESHOLD = 32 << 20
#: Free bytes at the heap's top that glibc keeps rather than trims.
TRIM_THRESHOLD = 32 << 20

_libc: Any = None


def glibc() -> Any:
    """The C library through ctypes when it is glibc (has ``mallopt``), else None."""
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
    return _libc or None


def raise_malloc_thresholds() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; False where not glibc."""
    lib = glibc()
    if lib is None:
        return False
    ok = bool(lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return ok & bool(lib.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def tune_malloc() -> bool:
    """Opt in to the fixed thresholds in a client process that takes large batches (a
    trainer calling ``stream()``); they apply to the whole process, so nothing calls this
    for you. False where the C library is not glibc."""
    return raise_malloc_thresholds()
