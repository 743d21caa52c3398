"""Large buffers reused across requests, each handed out again only once nobody sees it.

A fresh buffer of many MiB costs more than the bytes it carries: glibc maps it anew (past
its mmap threshold) and the kernel faults its pages in one by one as they are first
written, and on a virtual machine that is slower than copying them. The server writes its
columnar answers, and the client reads them, into buffers of a :class:`BufferPool`.

A buffer is handed out as a ``memoryview`` of its first ``size`` bytes; whatever is made
from it (NumPy arrays over it, a transport still sending it) holds a reference to the
``bytearray`` through that view. :meth:`BufferPool.take` reuses a buffer only when the pool
holds the last reference to it, so bytes somebody can still see are never overwritten.
The pool keeps ``max_buffers`` buffers at most: a buffer still in use when the pool needs
room is forgotten by the pool (its holders keep it alive; it is freed with them).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

__all__ = ["BufferPool"]

#: References to a free buffer while :meth:`BufferPool.take` looks at it: the pool's list,
#: the loop variable, and ``sys.getrefcount``'s own argument.
_FREE_REFS: Final = 3


class BufferPool:
    """Buffers of at least ``min_bytes`` reused once nobody sees them (see the module).

    Not thread-safe: one pool serves one event loop.

    Args:
        max_buffers: Buffers the pool keeps at most (in use or free).
        min_bytes: Smaller requests get a fresh ``bytearray``, not kept (the heap serves
            them without faults).
    """

    def __init__(self, *, max_buffers: int = 4, min_bytes: int = 256 << 10) -> None:
        if max_buffers < 0:
            raise ValueError(f"max_buffers ({max_buffers}) must be >= 0")
        self._max_buffers = max_buffers
        self._widenings: list[int] = []
        self._min_bytes = min_bytes
        self._buffers: list[bytearray] = []

    def take(self, size: int) -> memoryview:
        """A writable view of ``size`` bytes that nobody else sees (contents undefined).

        The view, and anything made from it, keeps its buffer from being handed out again.
        """
        if size < self._min_bytes:
            return memoryview(bytearray(size))
        buffers = self._buffers
        too_small: int | None = None  # a free buffer to replace by a larger one
        busy: int | None = None  # a buffer in use the pool may forget
        for i in range(len(buffers)):  # by index: enumerate's tuple would hold a reference
            buf = buffers[i]
            if sys.getrefcount(buf) > _FREE_REFS:
                busy = i
            elif len(buf) >= size:
                return memoryview(buf)[:size]
            elif too_small is None:
                too_small = i
        fresh = bytearray(size)
        if too_small is not None:
            buffers[too_small] = fresh
        elif len(buffers) < max(self._max_buffers, *self._widenings, 0):
            buffers.append(fresh)
        elif busy is not None:
            buffers[busy] = fresh
        return memoryview(fresh)[:size]

    @contextmanager
    def widened(self, max_buffers: int) -> Iterator[None]:
        """Keep up to ``max_buffers`` buffers while the block runs (a stream with several
        answers in flight, each held by its caller for a while, needs that many to reuse
        them); past it, the pool keeps what it kept before."""
        self._widenings.append(max_buffers)
        try:
            yield
        finally:
            self._widenings.remove(max_buffers)
            del self._buffers[max(self._max_buffers, *self._widenings, 0) :]

    def held_bytes(self) -> int:
        """Bytes of the buffers the pool keeps (in use or free)."""
        return sum(len(buf) for buf in self._buffers)
