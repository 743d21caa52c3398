"""Pure ASGI middleware: request context, API keys and the request size limit, in one pass.

:class:`RequestContextMiddleware` is the only middleware :func:`rlreplay.app.main.create_app`
installs. For each request, in this order, it

1. gives the request an id (``X-Request-ID``),
2. answers 401 on ``/v1`` (and ``/metrics`` when asked) without a valid bearer key (only
   when keys are configured),
3. answers 413 before a body over the limit is buffered,
4. runs the app, turning an exception nothing else handled into a 500 (a client that
   disconnected mid-request is recorded as 499, nginx's "client closed request"),
5. records the request's metrics and writes its access log line.

One class rather than a stack of three: each ASGI layer costs a coroutine, a ``send``
wrapper and its own scan of the headers per request, and a plain ASGI callable rather than
``BaseHTTPMiddleware``, which costs a task and a memory stream per request.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rlreplay.app.api.errors import error_response, wants_msgpack_header
from rlreplay.app.api.logs import ACCESS_LOGGER, AccessLog, request_level
from rlreplay.app.metrics import Metrics
from rlreplay.app.storage.faults import storage_error
from rlreplay.wire.errors import BadRequest, PayloadTooLarge, ReplayError, Unauthorized

__all__ = ["RequestContextMiddleware"]

_log = logging.getLogger("rlreplay.api")
_access = logging.getLogger(ACCESS_LOGGER)

_MAX_REQUEST_ID = 128
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")
#: Status recorded for a request whose client disconnected before it was answered (nginx's).
_CLIENT_CLOSED = 499
_UNAUTHORIZED = "a valid 'Authorization: Bearer <key>' header is required"


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _state(scope: Scope) -> dict[str, Any]:
    state: dict[str, Any] = scope.setdefault("state", {})
    return state


_ID_PREFIX = os.urandom(8).hex()
_id_counter = itertools.count(1)


def _new_request_id() -> str:
    """32 hex digits: 16 random ones drawn at start-up, then a counter.

    Unique within the process and, with overwhelming odds, across restarts; no system
    call per request (``os.urandom`` per request showed in a push's profile).
    """
    return f"{_ID_PREFIX}{next(_id_counter):016x}"


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
    """Gives each request an id, checks its key and size, logs it and records its metrics.

    * The id is the client's ``X-Request-ID`` when it is a short token, a fresh one
      otherwise, and comes back in the ``X-Request-ID`` response header.
    * With API keys configured, ``/v1`` needs ``Authorization: Bearer <key>`` with one of
      them (401 ``unauthorized`` otherwise), and so does ``/metrics`` with
      ``metrics_require_key``; health, readiness and the documentation stay open. Keys are
      compared with :func:`hmac.compare_digest` against every key.
    * A body over ``max_body_bytes`` is 413 ``payload_too_large``: a ``Content-Length`` over
      the limit is refused at once; a chunked body is counted as it streams in and the
      request fails as soon as the count passes the limit.
    * An exception nothing else handled becomes a 500 ``internal`` answer, logged with its
      traceback.
    * Every request, refused ones included, is one access log line (logger
      ``rlreplay.access``) and one observation in :class:`rlreplay.app.metrics.Metrics`.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        max_body_bytes: int,
        api_keys: Sequence[str] = (),
        metrics_require_key: bool = False,
        access_log: AccessLog | None = None,
    ) -> None:
        """Wraps ``app``.

        Args:
            app: The app.
            metrics: Where requests are recorded.
            max_body_bytes: The largest request body accepted.
            api_keys: The bearer keys ``/v1`` requires; none required when empty.
            metrics_require_key: ``/metrics`` requires one of ``api_keys`` too.
            access_log: Where request lines are written in batches; through the
                ``rlreplay.access`` logger when None.
        """
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.keys = [k.encode() for k in api_keys]
        self.metrics_require_key = metrics_require_key
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Runs one request through the checks and the app, then records it."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        given = authorization = declared = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                given = value
            elif name == b"content-length":
                declared = value
            elif name == b"authorization":
                authorization = value
        request_id = given.decode("latin-1") if given else ""
        if not (0 < len(request_id) <= _MAX_REQUEST_ID and set(request_id) <= _ID_CHARS):
            request_id = _new_request_id()
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
            refusal = self._refusal(scope["path"], authorization, declared)
            if refusal is not None:
                await send_error(scope, receive, send_with_id, refusal)
            elif declared is None:
                await self.app(scope, self._counting(receive), send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            # The client went away, or was cut off for sending too slowly (see
            # app.api.connections): nobody is left to answer and nothing is wrong here.
            status = _CLIENT_CLOSED
        except Exception as exc:
            _log.exception(
                "unhandled error", extra={"request_id": request_id, "path": scope["path"]}
            )
            if started:
                raise
            # storage that fails under a read (RocksDB reopening, an I/O error) is the
            # contract's 507 or 503, not a bug's 500
            error = (
                storage_error(exc, "the data directory")
                if isinstance(exc, OSError)
                else ReplayError(f"internal server error (request id {request_id})")
            )
            await send_error(scope, receive, send_with_id, error)
        finally:
            self._record(scope, request_id, status, time.perf_counter() - start)

    def _refusal(
        self, path: str, authorization: bytes | None, declared: bytes | None
    ) -> ReplayError | None:
        """Why the request is refused before the app runs: no valid key, or a body too large."""
        if self.keys and self._needs_key(path):
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

    def _needs_key(self, path: str) -> bool:
        """Whether ``path`` is one that API keys protect."""
        return (
            path == "/v1"
            or path.startswith("/v1/")
            or (self.metrics_require_key and path == "/metrics")
        )

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"the request body is over the limit of {self.max_body_bytes} bytes")

    def _counting(self, receive: Receive) -> Receive:
        """``receive`` that fails with 413 once the body received passes the limit."""
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise self._too_large()
            return message

        return counting_receive

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
        level = request_level(scope["path"])
        if _access.isEnabledFor(level):
            client = scope.get("client")
            fields = {
                "request_id": request_id,
                "method": scope["method"],
                "path": scope["path"],
                "route": template,
                "status": status,
                "error_code": error_code,
                "duration_ms": round(seconds * 1000, 3),
                "client": f"{client[0]}:{client[1]}" if client else None,
            }
            if self.access_log is not None:
                self.access_log.request(**fields)
            else:
                _access.log(level, "request", extra=fields)
