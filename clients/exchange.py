"""One request and its answer on a :class:`~rlreplay.clients.connection.Connection`, with httpx's
errors.

Writing the request and reading the answer (head, then a body framed by ``Content-Length``,
chunks or the end of the connection) is where socket failures become ``httpx`` errors, and
where a reused connection that the server had already closed is told apart
(:class:`StaleConnection`) so the transport can send a safe request once more.
"""

from __future__ import annotations

import asyncio
from typing import Final

import httpx

from rlreplay.clients.connection import Connection
from rlreplay.clients.http11 import BODY_PIECE, Answer, parse_head
from rlreplay.wire.pieces import Pieces

__all__ = ["WRITE_PIECE", "StaleConnection", "read_answer", "write_request"]

_BODYLESS_STATUS: Final = frozenset({204, 304})
#: Bodies shorter than this go out in one write with their head.
_JOIN_BELOW: Final = 64 << 10
#: A long piece of a body goes to the transport this much at a time. What the socket does
#: not take of a step at once waits in the transport until it is sent, and the next step is
#: written only then: longer steps mean fewer of those waits, and wake-ups, per body
#: (``python -m bench.bulk --arms`` compares 1 MiB with 256 KiB).
WRITE_PIECE = 1 << 20


class StaleConnection(Exception):
    """A reused connection failed before any byte of the answer: the request may be resent."""

    def __init__(self, error: httpx.TransportError) -> None:
        super().__init__(str(error))
        self.error = error


async def write_request(
    conn: Connection, head: bytes, body: bytes | Pieces, timeout_s: float | None
) -> None:
    """Send the request's ``head`` and ``body`` and wait until they are handed to the kernel.

    A short body goes out joined to the head (one write); a long one after it, not copied
    into a joined request first (a push of columns is MiBs). A body in
    :class:`~rlreplay.wire.pieces.Pieces` goes a piece at a time, each long one in
    :data:`WRITE_PIECE` steps, the next written once the transport has handed the last to
    the kernel: the kernel copies the bytes from where they lie, and the transport's buffer
    holds (a copy of) only what the socket did not take at once.

    Raises:
        httpx.WriteTimeout: The write did not drain within ``timeout_s``.
        httpx.WriteError: The connection failed.
        StaleConnection: A reused connection was found closed by the server.
    """
    try:
        if isinstance(body, Pieces):
            async with asyncio.timeout(timeout_s):
                await _write_pieces(conn, head, body)
        else:
            if len(body) < _JOIN_BELOW:
                conn.write(head + body if body else head)
            else:
                conn.write(head)
                conn.write(body)
            async with asyncio.timeout(timeout_s):
                await conn.drain()
    except TimeoutError as exc:
        raise httpx.WriteTimeout("writing the request timed out") from exc
    except OSError as exc:
        error = httpx.WriteError(f"writing the request failed: {exc!r}")
        error.__cause__ = exc
        if conn.reused and isinstance(exc, ConnectionError):
            raise StaleConnection(error) from exc
        raise error from exc


async def _write_pieces(conn: Connection, head: bytes, body: Pieces) -> None:
    parts = body.parts
    if parts and len(parts[0]) < _JOIN_BELOW:  # the map's head and the keys, say
        conn.write(head + parts[0])
        parts = parts[1:]
    else:
        conn.write(head)
    for part in parts:
        for start in range(0, len(part), WRITE_PIECE):
            conn.write(part[start : start + WRITE_PIECE])
            await conn.drain()


async def read_answer(
    request: httpx.Request, conn: Connection, timeout_s: float | None, max_header_bytes: int
) -> tuple[Answer, bytes | bytearray | memoryview]:
    """The final answer to ``request`` (interim 1xx answers skipped) and its whole body (a
    long one in the bytearray it was read into).

    ``answer.keep_alive`` is cleared when the connection must not be reused after it.

    Raises:
        httpx.ReadTimeout: A read waited longer than ``timeout_s``.
        httpx.ReadError: The connection failed.
        httpx.RemoteProtocolError: The answer is not valid HTTP/1.x or ended early.
        StaleConnection: A reused connection was found closed by the server.
    """
    first = True
    while True:
        answer = await _read_head(conn, timeout_s, max_header_bytes, first=first)
        first = False
        if answer.status < 200 and answer.status != 101:
            continue  # an interim answer (100 Continue, 103 Early Hints)
        break
    if request.method == "HEAD" or answer.status in _BODYLESS_STATUS or answer.status < 200:
        if answer.status == 101:
            answer.keep_alive = False  # upgrades are not supported: drop the connection
        return answer, b""
    length: int | None = None
    chunked = False
    for name, value in answer.headers:
        lowered = name.lower()
        if lowered == b"transfer-encoding":
            chunked = value.split(b",")[-1].strip().lower() == b"chunked"
            if not chunked:
                length = None
                answer.keep_alive = False  # framed by the end of the connection
                break
        elif lowered == b"content-length" and not chunked:
            if not value.isdigit() or (length is not None and int(value) != length):
                raise httpx.RemoteProtocolError(f"invalid Content-Length {value[:40]!r}")
            length = int(value)
    try:
        if chunked:
            if length is not None:
                answer.keep_alive = False  # both framings: RFC 9112 6.3, don't reuse
            return answer, await _read_chunked(conn, timeout_s, max_header_bytes)
        if length is not None:
            return answer, await conn.readexactly(length, timeout_s)
        answer.keep_alive = False
        return answer, await _read_to_end(conn, timeout_s)
    except asyncio.IncompleteReadError as exc:
        raise httpx.RemoteProtocolError(
            f"the server closed the connection {len(exc.partial)} bytes into a piece of the body"
        ) from exc
    except TimeoutError as exc:
        raise httpx.ReadTimeout("reading the answer's body timed out") from exc
    except asyncio.LimitOverrunError as exc:
        raise httpx.RemoteProtocolError("a chunk header is too long") from exc
    except ValueError as exc:  # a malformed chunk size, or the reader's own limit
        raise httpx.RemoteProtocolError(f"malformed chunked body: {exc}") from exc
    except OSError as exc:
        raise httpx.ReadError(f"reading the answer failed: {exc!r}") from exc


async def _read_head(
    conn: Connection, timeout_s: float | None, max_header_bytes: int, *, first: bool
) -> Answer:
    """The status line and headers; a stale reused connection raises StaleConnection."""
    try:
        head = await conn.readuntil(b"\r\n\r\n", max_header_bytes, timeout_s)
    except TimeoutError as exc:
        raise httpx.ReadTimeout("waiting for the answer timed out") from exc
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise httpx.RemoteProtocolError(
                "the server closed the connection in the middle of the answer's head"
            ) from exc
        error: httpx.TransportError = httpx.RemoteProtocolError(
            "the server closed the connection without sending an answer"
        )
        error.__cause__ = exc
        if first and conn.reused:
            raise StaleConnection(error) from exc
        raise error from exc
    except asyncio.LimitOverrunError as exc:
        raise httpx.RemoteProtocolError(
            f"the answer's head is longer than {max_header_bytes} bytes"
        ) from exc
    except OSError as exc:
        error = httpx.ReadError(f"reading the answer failed: {exc!r}")
        error.__cause__ = exc
        if first and conn.reused and isinstance(exc, ConnectionError):
            raise StaleConnection(error) from exc
        raise error from exc
    if len(head) > max_header_bytes:
        raise httpx.RemoteProtocolError(
            f"the answer's head is longer than {max_header_bytes} bytes"
        )
    return parse_head(head)


async def _read_chunked(conn: Connection, timeout_s: float | None, max_header_bytes: int) -> bytes:
    pieces: list[memoryview] = []
    while True:
        line = await conn.readuntil(b"\r\n", max_header_bytes, timeout_s)
        if len(line) > max_header_bytes:
            raise ValueError("chunk header too long")
        size_text = line[:-2].split(b";", 1)[0].strip()
        if not size_text or any(c not in b"0123456789abcdefABCDEF" for c in size_text):
            raise ValueError(f"invalid chunk size {size_text[:40]!r}")
        size = int(size_text, 16)
        if size == 0:
            break
        data = await conn.readexactly(size + 2, timeout_s)
        if data[-2:] != b"\r\n":
            raise ValueError("a chunk does not end with CRLF")
        pieces.append(memoryview(data)[:-2])
    trailer_bytes = 0
    while True:  # trailers, up to the blank line
        line = await conn.readuntil(b"\r\n", max_header_bytes, timeout_s)
        if line == b"\r\n":
            break
        trailer_bytes += len(line)
        if trailer_bytes > max_header_bytes:
            raise ValueError("trailers too long")
    return b"".join(pieces)


async def _read_to_end(conn: Connection, timeout_s: float | None) -> bytes:
    pieces: list[bytes] = []
    while True:
        data = await conn.read(BODY_PIECE, timeout_s)
        if not data:
            return b"".join(pieces)
        pieces.append(data)
