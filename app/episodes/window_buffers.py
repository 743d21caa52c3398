"""The arrays of window batches, in buffers reused across samples.

A batch of Atari windows is a few hundred MiB of fresh arrays per sample; a fresh buffer of
that size is mapped anew and faulted in page by page as it is first written, which costs
more than the copy into it. :class:`WindowBuffers` hands out arrays over the buffers of a
:class:`~rlreplay.wire.buffer_pool.BufferPool`: a buffer is reused only once nothing holds
an array over it (the answer made from a batch is written, and the batch dropped), so an
answer never sees its bytes change.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt

from rlreplay.wire.buffer_pool import BufferPool

__all__ = ["WindowBuffers"]

#: Buffers kept at most: a few samples' largest fields in flight at once.
MAX_BUFFERS: Final = 4


class WindowBuffers:
    """An ``alloc`` for :class:`~rlreplay.app.episodes.windows.WindowBuild` over reused
    buffers (contents undefined). Not thread-safe: arrays are taken on the event loop.

    Args:
        max_buffers: Buffers the pool keeps (in use or free); smaller arrays than its
            ``min_bytes`` are fresh.
    """

    def __init__(self, *, max_buffers: int = MAX_BUFFERS) -> None:
        self._pool = BufferPool(max_buffers=max_buffers)

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
        """An array of ``shape`` and ``dtype`` over a buffer nobody else sees."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        view = self._pool.take(nbytes)
        return np.frombuffer(view, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)

    def held_bytes(self) -> int:
        """Bytes of the buffers kept."""
        return self._pool.held_bytes()
