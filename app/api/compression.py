"""``Content-Encoding: zstd`` on the server: installed only with ``--zstd`` (off by default).

:class:`ZstdCoding` sits inside :class:`~rlreplay.app.api.middleware.RequestContextMiddleware`
(which has already checked the compressed length against ``--max-request-mb``), around
both the hot routes and FastAPI's. It

* decompresses a request body sent with ``Content-Encoding: zstd`` before the route reads
  it, refusing one that decompresses past ``--max-request-mb`` (413) or is not zstd (400);
  any other coding is refused with 415;
* compresses an answer of :data:`~rlreplay.wire.compression.MIN_BYTES` or more, sent in
  one piece, for a request whose ``Accept-Encoding`` names zstd (``Vary: Accept-Encoding``
  says so to caches). Streamed answers (``/v1/changes``) go as they are.

Compression and decompression run off the event loop, in the engine's I/O threads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rlreplay.app.api.gathered_writes import AnswerPieces
from rlreplay.app.api.middleware import send_error
from rlreplay.wire.compression import (
    MIN_BYTES,
    TooLarge,
    accepts_zstd,
    compress,
    decompress,
    is_zstd,
)
from rlreplay.wire.errors import BadRequest, PayloadTooLarge, ReplayError, UnsupportedMediaType

__all__ = ["Offload", "ZstdCoding"]

#: Runs a blocking function off the event loop: ``await offload(fn, *args)``.
Offload = Callable[..., Awaitable[Any]]

_NO_BODY_STATUSES = frozenset({204, 304})


async def _inline(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class ZstdCoding:
    """zstd request bodies decompressed and answers compressed (see the module).

    Args:
        app: The ASGI app inside.
        max_body_bytes: The largest request body accepted, decompressed.
        offload: Runs compression off the loop (inline when None: tests).
    """

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, offload: Offload | None = None
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self._offload = offload or _inline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        accept = coding = None
        for name, value in scope["headers"]:
            if name == b"accept-encoding":
                accept = value
            elif name == b"content-encoding":
                coding = value
        if accept is not None and accepts_zstd(accept):
            send = _Compressing(send, self._offload).send
        if coding is not None and coding.strip().lower() != b"identity":
            try:
                scope, receive = await self._decompressed(scope, receive, coding)
            except ReplayError as exc:
                await send_error(scope, receive, send, exc)
                return
        await self.app(scope, receive, send)

    async def _decompressed(
        self, scope: Scope, receive: Receive, coding: bytes
    ) -> tuple[Scope, Receive]:
        """The request as the route sees it: its body decompressed, in one message."""
        if not is_zstd(coding):
            raise UnsupportedMediaType(
                f"Content-Encoding {coding.decode('latin-1')!r} is not supported (zstd is)"
            )
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        try:
            body = await self._offload(decompress, b"".join(chunks), self.max_body_bytes)
        except TooLarge:
            raise PayloadTooLarge(
                f"the request body is over the limit of {self.max_body_bytes} bytes, decompressed"
            ) from None
        except ValueError as exc:
            raise BadRequest(f"the zstd request body cannot be read: {exc}") from None
        headers = [
            (name, value)
            for name, value in scope["headers"]
            if name not in (b"content-encoding", b"content-length")
        ]
        headers.append((b"content-length", str(len(body)).encode()))
        sent = False

        async def decoded_receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return {**scope, "headers": headers}, decoded_receive


class _Compressing:
    """One answer's ``send``: its start held back until the body shows whether to compress."""

    __slots__ = ("_offload", "_send", "_start")

    def __init__(self, send: Send, offload: Offload) -> None:
        self._send = send
        self._offload = offload
        self._start: Message | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._start = message
            return
        start, self._start = self._start, None
        if start is None or message["type"] != "http.response.body":
            await self._send(message)
            return
        body = message.get("body", b"")
        headers = list(start.get("headers", ()))
        if (
            message.get("more_body", False)
            or len(body) < MIN_BYTES
            or start["status"] in _NO_BODY_STATUSES
            or any(name.lower() == b"content-encoding" for name, _ in headers)
        ):
            await self._send(start)
            await self._send(message)
            return
        pieces = body.pieces if type(body) is AnswerPieces else [body]
        coded = await self._offload(compress, pieces)
        headers = [(n, v) for n, v in headers if n.lower() != b"content-length"]
        headers += [
            (b"content-length", str(len(coded)).encode()),
            (b"content-encoding", b"zstd"),
            (b"vary", b"accept-encoding"),
        ]
        await self._send({**start, "headers": headers})
        await self._send({"type": "http.response.body", "body": coded})
