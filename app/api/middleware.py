"""Pure ASGI middleware: request context, API keys and the request size limit.

Outermost first, as :func:`app.main.create_app` installs them::

    RequestContextMiddleware   request id, access log, latency metrics, 500 for the unexpected
    ApiKeyMiddleware           bearer keys on /v1 (only when keys are configured)
    BodyLimitMiddleware        413 before a body over the limit is buffered

They are plain ASGI callables rather than ``BaseHTTPMiddleware``, which costs a task and a
memory stream per request.
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.logs import ACCESS_LOGGER
from app.errors import (
    BadRequest,
    PayloadTooLarge,
    ReplayError,
    Unauthorized,
    error_response,
    wants_msgpack_header,
)
from app.metrics import Metrics

__all__ = ["ApiKeyMiddleware", "BodyLimitMiddleware", "RequestContextMiddleware"]

_log = logging.getLogger("rlreplay.api")
_access = logging.getLogger(ACCESS_LOGGER)

_MAX_REQUEST_ID = 128
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _state(scope: Scope) -> dict[str, Any]:
    state: dict[str, Any] = scope.setdefault("state", {})
    return state


async def send_error(scope: Scope, receive: Receive, send: Send, exc: ReplayError) -> None:
    """Answers the request with ``exc`` as the contract's error body.

    Args:
        scope: The request's scope (its ``Accept`` picks JSON or msgpack).
        receive: The ASGI receive callable.
        send: The ASGI send callable.
        exc: The error to answer with.
    """
    _state(scope)["error_code"] = exc.code
    accept = _header(scope, b"accept")
    response = error_response(
        exc, msgpack_body=wants_msgpack_header(accept.decode("latin-1") if accept else None)
    )
    await response(scope, receive, send)


class RequestContextMiddleware:
    """Gives each request an id, logs it as one JSON line and records its metrics.

    The id is the client's ``X-Request-ID`` when it is a short token, a fresh one otherwise,
    and comes back in the ``X-Request-ID`` response header. An exception nothing else
    handled becomes a 500 ``internal`` answer, logged with its traceback.
    """

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        """Wraps ``app``, recording into ``metrics``."""
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Runs one request through the app with its id, log line and metrics."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        given = _header(scope, b"x-request-id")
        request_id = given.decode("latin-1") if given else ""
        if not (0 < len(request_id) <= _MAX_REQUEST_ID and set(request_id) <= _ID_CHARS):
            request_id = uuid.uuid4().hex
        _state(scope)["request_id"] = request_id
        id_header = (b"x-request-id", request_id.encode("latin-1"))
        status = 500
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), id_header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            _log.exception(
                "unhandled error", extra={"request_id": request_id, "path": scope["path"]}
            )
            if started:
                raise
            await send_error(
                scope,
                receive,
                send_with_id,
                ReplayError(f"internal server error (request id {request_id})"),
            )
        finally:
            self._record(scope, request_id, status, time.perf_counter() - start)

    def _record(self, scope: Scope, request_id: str, status: int, seconds: float) -> None:
        route = scope.get("route")
        template = getattr(route, "path_format", None) or getattr(route, "path", None)
        op = getattr(route, "name", None) if template and template.startswith("/v1") else None
        error_code = _state(scope).get("error_code")
        self.metrics.observe_request(
            route=template or "<unmatched>",
            method=scope["method"],
            status=status,
            seconds=seconds,
            op=op,
            error_code=error_code,
        )
        if _access.isEnabledFor(logging.INFO):
            client = scope.get("client")
            _access.info(
                "request",
                extra={
                    "request_id": request_id,
                    "method": scope["method"],
                    "path": scope["path"],
                    "route": template,
                    "status": status,
                    "error_code": error_code,
                    "duration_ms": round(seconds * 1000, 3),
                    "client": f"{client[0]}:{client[1]}" if client else None,
                },
            )


class ApiKeyMiddleware:
    """Requires ``Authorization: Bearer <key>`` with one of the configured keys on ``/v1``.

    Health, readiness, metrics and the documentation stay open. Keys are compared with
    :func:`hmac.compare_digest` against every configured key.
    """

    def __init__(self, app: ASGIApp, *, keys: Sequence[str]) -> None:
        """Wraps ``app``; ``keys`` must not be empty."""
        self.app = app
        self.keys = [k.encode() for k in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Lets the request through when its path is open or its bearer token is a key."""
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not (path == "/v1" or path.startswith("/v1/")):
            await self.app(scope, receive, send)
            return
        auth = _header(scope, b"authorization") or b""
        scheme, _, token = auth.strip().partition(b" ")
        token = token.strip()
        ok = False
        if scheme.lower() == b"bearer" and token:
            for key in self.keys:  # no early exit: the time does not depend on which key
                ok |= hmac.compare_digest(token, key)
        if not ok:
            message = "a valid 'Authorization: Bearer <key>' header is required"
            await send_error(scope, receive, send, Unauthorized(message))
            return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Answers 413 ``payload_too_large`` for bodies over ``max_bytes``, before buffering them.

    A ``Content-Length`` over the limit is refused at once; a chunked body is counted as it
    streams in and the request fails as soon as the count passes the limit.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        """Wraps ``app`` with a limit of ``max_bytes`` per request body."""
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"the request body is over the limit of {self.max_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Checks the declared length, then counts what actually arrives."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await send_error(scope, receive, send, BadRequest("invalid Content-Length"))
                return
            if length > self.max_bytes:
                await send_error(scope, receive, send, self._too_large())
                return
            await self.app(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise self._too_large()
            return message

        await self.app(scope, counting_receive, send)
