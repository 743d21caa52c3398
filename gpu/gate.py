"""The sidecar's gate: its own bearer keys and the request size limit, before the app.

The same rules as ``rlreplay serve``'s request middleware: with keys configured, ``/v1``
(and ``/metrics`` with ``metrics_require_key``) needs ``Authorization: Bearer <key>`` with
one of them, compared with :func:`hmac.compare_digest` against every key (401
``unauthorized``); ``/healthz`` and ``/readyz`` stay open. A body over ``max_body_bytes`` is
413 ``payload_too_large``: a ``Content-Length`` over it before a byte of the body is read,
a chunked body as soon as its count passes it (then the connection is closed, the rest of
the body unread). These keys are the sidecar's callers'; the key it reads the server with
is another (``--server-api-key``).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rlreplay.gpu.error_answers import error_answer, wants_msgpack
from rlreplay.wire.errors import BadRequest, PayloadTooLarge, ReplayError, Unauthorized

__all__ = ["RequestGate"]

_UNAUTHORIZED = "a valid 'Authorization: Bearer <key>' header is required"


class RequestGate:
    """Refuses a request without a valid key or with a body over the limit (pure ASGI).

    Args:
        app: The sidecar's app.
        max_body_bytes: The largest request body accepted.
        api_keys: The bearer keys ``/v1`` requires; none required when empty.
        metrics_require_key: ``/metrics`` requires one of ``api_keys`` too.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        api_keys: Sequence[str] = (),
        metrics_require_key: bool = False,
    ) -> None:
        if max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes ({max_body_bytes}) must be > 0")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.keys = [key.encode() for key in api_keys]
        self.metrics_require_key = metrics_require_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Runs the checks, then the app (with a chunked body already read and counted)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        authorization = declared = accept = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                declared = value
            elif name == b"accept":
                accept = value.decode("latin-1")
        as_msgpack = wants_msgpack(accept)
        refusal = self._refusal(scope["path"], authorization, declared)
        if declared is None and refusal is None:  # chunked, or no body: counted as it comes
            first = await self._read_counting(receive)
            if first is None:
                refusal = self._too_large()
            else:
                receive = _replaying(first, receive)
        if refusal is not None:
            # a body too large is left unread: the connection is closed rather than drained
            close = {"connection": "close"} if isinstance(refusal, PayloadTooLarge) else None
            await error_answer(refusal, as_msgpack=as_msgpack, headers=close)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(
        self, path: str, authorization: bytes | None, declared: bytes | None
    ) -> ReplayError | None:
        """Why the request is refused before its body is read: no valid key, or a
        ``Content-Length`` over the limit."""
        if self.keys and (
            path == "/v1"
            or path.startswith("/v1/")
            or (self.metrics_require_key and path == "/metrics")
        ):
            scheme, _, token = (authorization or b"").strip().partition(b" ")
            token = token.strip()
            ok = False
            if scheme.lower() == b"bearer" and token:
                for key in self.keys:  # no early exit: the time does not depend on which key
                    ok |= hmac.compare_digest(token, key)
            if not ok:
                return Unauthorized(_UNAUTHORIZED)
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                return BadRequest("invalid Content-Length")
            if length > self.max_body_bytes:
                return self._too_large()
        return None

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"the request body is over the limit of {self.max_body_bytes} bytes")

    async def _read_counting(self, receive: Receive) -> Message | None:
        """The whole body as one message (or the disconnect that cut it off), or None once
        it passes the limit (the rest left unread)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}


def _replaying(first: Message, receive: Receive) -> Receive:
    """``receive`` that hands over ``first``, then whatever the connection says."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return first
        return await receive()

    return replay
