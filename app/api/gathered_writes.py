"""Answers sent from where their bytes lie: a body of several buffers, one ``writelines``.

A columnar answer of large values is mostly the values' own bytes, each a slice of a value
the server stores. Rather than copying them into one body, :mod:`rlreplay.app.api.column_answers`
hands over an :class:`AnswerPieces` (the buffers in order), and the connection sends them with
``transport.writelines``: one ``writev`` to the kernel, which copies each slice once, straight
into the socket. The pieces are immutable (``bytes`` of stored values, or buffers nobody
writes again), so they may wait in the transport while the socket drains.

Only the httptools protocol of :mod:`rlreplay.app.api.connections` sends pieces: it marks
the request's scope with :data:`GATHERED_WRITES` and gives the request cycle a
:class:`GatheringTransport`. Anywhere else (h11, FastAPI's own path) the pieces are joined
first (:meth:`AnswerPieces.join`), the same bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

__all__ = ["GATHERED_WRITES", "AnswerPieces", "GatheringTransport"]

#: The scope key saying the connection sends :class:`AnswerPieces` as they are.
GATHERED_WRITES: Final = "rlreplay.gathered_writes"


class AnswerPieces:
    """An answer's body as buffers in order (``len()`` is its byte count)."""

    __slots__ = ("nbytes", "pieces")

    def __init__(self, pieces: Sequence[Any], nbytes: int) -> None:
        self.pieces = pieces
        self.nbytes = nbytes

    def __len__(self) -> int:
        return self.nbytes

    def join(self) -> bytes:
        """The body in one piece (a copy)."""
        return b"".join(self.pieces)


class GatheringTransport:
    """A connection's transport as a request cycle sees it: :class:`AnswerPieces` go out
    with ``writelines``, everything else as it would."""

    __slots__ = ("_transport",)

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: Any) -> None:
        if type(data) is AnswerPieces:
            self._transport.writelines(data.pieces)
        else:
            self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
