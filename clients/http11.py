"""The HTTP/1.1 message format, without I/O: encoding a request, parsing an answer's head.

Kept apart from the sockets so the wire rules (RFC 9112 framing, ``Connection`` tokens, the
checks that refuse a header with CR or LF) read in one place and need no event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

import httpx

from rlreplay.wire.pieces import Pieces

__all__ = [
    "BODY_PIECE",
    "MAX_HEADER_BYTES",
    "Answer",
    "has_token",
    "new_request",
    "parse_head",
    "request_body",
    "request_head",
]

BODY_PIECE: Final = 1 << 20  # a body is read (and timed) a MiB at a time
MAX_HEADER_BYTES: Final = 64 * 1024
_HTTP11: Final = b"HTTP/1.1"
_HTTP10: Final = b"HTTP/1.0"


class Answer:
    """The parsed head of an answer."""

    __slots__ = ("headers", "keep_alive", "reason", "status", "version")

    def __init__(
        self,
        status: int,
        reason: bytes,
        version: bytes,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
    ) -> None:
        self.status = status
        self.reason = reason
        self.version = version
        self.headers = headers
        self.keep_alive = keep_alive


def has_token(value: bytes, token: bytes) -> bool:
    """Whether the comma-separated header ``value`` holds ``token`` (lower case)."""
    return any(part.strip().lower() == token for part in value.split(b","))


def parse_head(head: bytes) -> Answer:
    """Parse a status line and headers (``head`` ends with the blank line)."""
    lines = head[:-4].split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (_HTTP11, _HTTP10) or len(code) != 3 or not code.isdigit():
        raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:100]!r}")
    headers: list[tuple[bytes, bytes]] = []
    connection = b""
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or b" " in name:
            raise httpx.RemoteProtocolError(f"malformed header line {line[:100]!r}")
        value = value.strip(b" \t")
        headers.append((name, value))
        if name.lower() == b"connection":
            connection += b"," + value
    if version == _HTTP11:
        keep_alive = not has_token(connection, b"close")
    else:
        keep_alive = has_token(connection, b"keep-alive")
    return Answer(int(code), reason, version, headers, keep_alive)


def request_head(request: httpx.Request, body: bytes | Pieces) -> bytes:
    """The request line and headers of ``request``, up to and including the blank line.

    Raises:
        httpx.LocalProtocolError: A header or the request line holds CR, LF or a bad space.
    """
    url = request.url
    target = url.raw_path
    method = request.method.encode("ascii")
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in request.headers.raw:
        if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name or b":" in name:
            raise httpx.LocalProtocolError(f"invalid header {name!r}: {value!r}")
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    if b" " in target or b"\r" in target or b"\n" in target or b" " in method:
        raise httpx.LocalProtocolError(f"invalid request line {method!r} {target!r}")
    return b"".join(parts)


class _PiecesStream(httpx.AsyncByteStream, httpx.SyncByteStream):
    """A request body given as :class:`~rlreplay.wire.pieces.Pieces`: the client's transport
    sends the pieces as they lie; another transport gets each as ``bytes``."""

    def __init__(self, pieces: Pieces) -> None:
        self.pieces = pieces

    def __iter__(self) -> Iterator[bytes]:
        return (bytes(part) for part in self.pieces.parts)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.pieces.parts:
            yield bytes(part)


def new_request(
    method: str,
    url: httpx.URL,
    *,
    headers: httpx.Headers,
    content: bytes | Pieces | None,
    extensions: dict[str, Any],
) -> httpx.Request:
    """``httpx.Request(...)``, with a body of :class:`~rlreplay.wire.pieces.Pieces` framed
    by its ``Content-Length`` and kept in pieces (:func:`request_body` gives them back)."""
    if type(content) is not Pieces:
        return httpx.Request(method, url, headers=headers, content=content, extensions=extensions)
    headers = headers.copy()
    headers["Content-Length"] = str(len(content))
    stream = _PiecesStream(content)
    return httpx.Request(method, url, headers=headers, stream=stream, extensions=extensions)


async def request_body(request: httpx.Request) -> bytes | Pieces:
    """The body of ``request`` as sent: read in full, one chunk when it asks for chunked;
    pieces (:func:`new_request`) as they are."""
    if type(request.stream) is _PiecesStream:
        return request.stream.pieces
    try:
        body = request.content
    except httpx.RequestNotRead:
        body = await request.aread()
    if has_token(request.headers.get("Transfer-Encoding", "").encode("latin-1"), b"chunked"):
        if not body:
            return b"0\r\n\r\n"
        return b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)
    return body
