"""A message as the buffers its bytes lie in: sent piece by piece, never joined.

A push of columns is a few hundred bytes of msgpack around MiBs of array data that already
lie in the caller's arrays. :class:`Pieces` keeps them apart: the small pieces joined (the
headers between two arrays), each large one a byte view of the array it came from. The
client's transport writes them in order (:func:`rlreplay.clients.exchange.write_request`),
so the arrays' bytes are copied once, by the kernel, into the socket.

The arrays must not change until the message is sent: the client's calls return only once
it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any, Final

import numpy as np

__all__ = ["LARGE_PIECE_BYTES", "Pieces", "byte_view"]

#: Pieces at least this long are kept as views; shorter ones are joined with their
#: neighbours (a write per piece costs more than copying a few KiB).
LARGE_PIECE_BYTES: Final = 64 << 10


def byte_view(part: Any) -> memoryview:
    """A flat, read-only byte view of a C-contiguous buffer (an array, bytes, a view)."""
    if isinstance(part, np.ndarray):
        return part.reshape(-1).view(np.uint8).data.toreadonly()
    view = memoryview(part)
    if not view.nbytes:  # an empty array of several axes: memoryview cannot cast it
        return memoryview(b"")
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return view.toreadonly()


class Pieces:
    """The bytes of one message, in order, as buffers: the message is their concatenation.

    Args:
        parts: Buffers (``bytes``, ``memoryview``, C-contiguous NumPy arrays), in order;
            short neighbours are joined here, long ones kept as byte views of their memory.
    """

    __slots__ = ("nbytes", "parts")

    def __init__(self, parts: Iterable[Any]) -> None:
        self.parts: list[bytes | memoryview] = []
        small: list[Any] = []
        nbytes = 0
        for part in parts:
            view = byte_view(part)
            size = view.nbytes
            if not size:
                continue
            nbytes += size
            if size < LARGE_PIECE_BYTES:
                small.append(view)
                continue
            if small:
                self.parts.append(b"".join(small))
                small = []
            self.parts.append(view)
        if small:
            self.parts.append(b"".join(small))
        self.nbytes = nbytes

    def __len__(self) -> int:
        return self.nbytes

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """The pieces as ``bytes``: an ``httpx.AsyncClient`` on a transport other than the
        client's own takes a body of pieces as a stream (chunked, each long piece copied)."""
        for part in self.parts:
            yield bytes(part)
