"""zstd on the wire: ``Content-Encoding: zstd`` (RFC 8878) for compressible batches over
slow links, off by default on both ends.

A client that enables it sends ``Accept-Encoding: zstd`` and compresses request bodies of
:data:`MIN_BYTES` and more; a server started with ``--zstd`` compresses such answers to a
client that asked and reads compressed request bodies (``docs/configuration.md``). On a
fast link (a Unix socket, a host's loopback, most data-centre networks) compression costs
more time than it saves: the bytes cross faster than zstd makes them.

Every frame written here carries its content size, so the reader allocates the result
once, and refuses a body that would decompress past its limit before decompressing it.
``zstandard`` is imported on first use: a process that never compresses never loads it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from rlreplay.wire.pieces import Pieces

__all__ = [
    "LEVEL",
    "MIN_BYTES",
    "ZSTD",
    "TooLarge",
    "accepts_zstd",
    "compress",
    "decompress",
    "decompress_into",
    "is_zstd",
]

#: The content coding's name, as in ``Content-Encoding`` and ``Accept-Encoding``.
ZSTD: Final = "zstd"
#: zstd's level: its fastest standard one (hundreds of MB/s a core).
LEVEL: Final = 1
#: Bodies shorter than this go uncompressed (a frame costs more than it saves there).
MIN_BYTES: Final = 16 << 10
#: Bytes read at a time from a frame whose content size is not written in it.
_CHUNK: Final = 1 << 20


class TooLarge(ValueError):
    """A body that decompresses past the limit asked."""


def _zstd() -> Any:
    import zstandard

    return zstandard


def accepts_zstd(accept_encoding: bytes | str) -> bool:
    """Whether an ``Accept-Encoding`` value accepts zstd (named with a q-value above 0)."""
    text = (
        accept_encoding.decode("latin-1") if isinstance(accept_encoding, bytes) else accept_encoding
    )
    for part in text.split(","):
        coding, _, params = part.partition(";")
        if coding.strip().lower() != ZSTD:
            continue
        name, _, value = params.partition("=")
        if name.strip().lower() != "q":
            return True
        try:
            return float(value) > 0
        except ValueError:
            return False
    return False


def is_zstd(content_encoding: bytes | str) -> bool:
    """Whether a ``Content-Encoding`` value is zstd alone."""
    text = (
        content_encoding.decode("latin-1")
        if isinstance(content_encoding, bytes)
        else content_encoding
    )
    return text.strip().lower() == ZSTD


def compress(pieces: Sequence[Any], level: int = LEVEL) -> bytes:
    """One zstd frame of the buffers ``pieces`` in order (not joined first), its content
    size written in it; a :class:`~rlreplay.wire.pieces.Pieces` stands for its own."""
    pieces = [p for piece in pieces for p in (piece.parts if type(piece) is Pieces else (piece,))]
    sizes = [memoryview(piece).nbytes for piece in pieces]
    stream = _zstd().ZstdCompressor(level=level).compressobj(size=sum(sizes))
    out = [stream.compress(piece) for piece, size in zip(pieces, sizes, strict=True) if size]
    out.append(stream.flush())
    return b"".join(out)


def decompress(body: Any, max_bytes: int) -> bytes:
    """The content of zstd ``body``.

    Raises:
        TooLarge: It holds more than ``max_bytes``.
        ValueError: It is not zstd, or is malformed.
    """
    zstd = _zstd()
    size = _content_size(body)
    if size is not None and size > max_bytes:
        raise TooLarge(f"it decompresses to {size} bytes, over the limit of {max_bytes}")
    try:
        reader = zstd.ZstdDecompressor().stream_reader(body, read_across_frames=True)
        chunks: list[bytes] = []
        got = 0
        while chunk := reader.read(_CHUNK):
            got += len(chunk)
            if got > max_bytes:
                raise TooLarge(f"it decompresses to more than the limit of {max_bytes} bytes")
            chunks.append(chunk)
    except zstd.ZstdError as exc:
        raise ValueError(f"malformed zstd: {exc}") from exc
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def decompress_into(body: Any, take: Callable[[int], memoryview]) -> memoryview:
    """The content of zstd ``body`` written into ``take(size)`` (a receive buffer the
    caller reuses), when the frame says its size; otherwise into a fresh buffer.

    Raises:
        ValueError: It is not zstd, or is malformed.
    """
    zstd = _zstd()
    size = _content_size(body)
    if size is None:
        return memoryview(bytearray(decompress(body, 1 << 62)))
    out = take(size)
    try:
        reader = zstd.ZstdDecompressor().stream_reader(body)
        filled = 0
        while filled < size:
            n = reader.readinto(out[filled:])
            if not n:
                raise ValueError(f"the zstd frame ended {size - filled} bytes short")
            filled += n
    except zstd.ZstdError as exc:
        raise ValueError(f"malformed zstd: {exc}") from exc
    return out


def _content_size(body: Any) -> int | None:
    zstd = _zstd()
    try:
        size = zstd.frame_content_size(body)
    except zstd.ZstdError as exc:
        raise ValueError(f"not a zstd frame: {exc}") from exc
    return None if size < 0 else int(size)
