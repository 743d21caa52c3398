"""The service's errors: the tree of ``rlreplay.wire.errors`` and the one place mapping it to HTTP.

The tree itself lives in :mod:`rlreplay.wire.errors` (so the client raises the very classes the
server does, and the server imports them from there); this module holds what turns an
exception into the contract's body ``{"error": {"code": ..., "message": ...}}``::

    ReplayError (rlreplay.wire.errors)  ──> replay_error_handler      ──> its status and code
    StarletteHTTPException         ──> http_exception_handler    ──> not_found, method_not_allowed
    RequestValidationError         ──> validation_error_handler  ──> 422 (400 for malformed input)
    anything else                  ──> app.api.middleware.RequestContextMiddleware ──> 500 internal

Overloaded and every other 503 carry a ``Retry-After`` header.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgpack
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from rlreplay.wire.errors import (
    BadRequest,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    ReplayError,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    ValidationFailed,
)

__all__ = [
    "error_response",
    "install_error_handlers",
    "wants_msgpack_header",
]

#: Seconds a client is told to wait after a 503 that carries no hint of its own.
DEFAULT_RETRY_AFTER_S = 1

_BY_STATUS: dict[int, type[ReplayError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    405: MethodNotAllowed,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: ValidationFailed,
    503: Unavailable,
}


def wants_msgpack_header(accept: str | None) -> bool:
    """Whether an ``Accept`` header value names msgpack (``application/(x-)msgpack``)."""
    return accept is not None and "msgpack" in accept.lower()


def error_headers(exc: ReplayError) -> dict[str, str]:
    """Extra headers of an error answer: ``Retry-After`` on 503, ``WWW-Authenticate`` on 401."""
    headers: dict[str, str] = {}
    if exc.status == 503 or isinstance(exc, Overloaded):
        retry = exc.retry_after if exc.retry_after is not None else DEFAULT_RETRY_AFTER_S
        headers["Retry-After"] = str(max(1, math.ceil(retry)))
    elif exc.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return headers


def error_body_bytes(exc: ReplayError, *, msgpack_body: bool) -> tuple[bytes, str]:
    """The contract's error body, encoded, and its media type."""
    body = exc.to_body()
    if msgpack_body:
        return msgpack.packb(body), "application/msgpack"
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(), "application/json"


def error_response(
    exc: ReplayError, *, msgpack_body: bool = False, headers: dict[str, str] | None = None
) -> Response:
    """A complete error answer for ``exc``: status, contract body and headers.

    Args:
        exc: The error to answer with.
        msgpack_body: Encode the body as msgpack (the request's ``Accept`` named it).
        headers: Headers to add (``Allow`` on a 405, for example).

    Returns:
        The response to send.
    """
    content, media_type = error_body_bytes(exc, msgpack_body=msgpack_body)
    all_headers = error_headers(exc)
    if headers:
        all_headers.update(headers)
    return Response(content, status_code=exc.status, media_type=media_type, headers=all_headers)


def _wants_msgpack(request: Request) -> bool:
    return wants_msgpack_header(request.headers.get("accept"))


def _remember_code(request: Request, exc: ReplayError) -> None:
    """Leaves the error code on the request's state, for the metrics of the request."""
    request.state.error_code = exc.code


async def replay_error_handler(request: Request, exc: Exception) -> Response:
    """Maps any :class:`ReplayError` to its status and the contract's body."""
    assert isinstance(exc, ReplayError)
    _remember_code(request, exc)
    return error_response(exc, msgpack_body=_wants_msgpack(request))


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    """Maps Starlette's own HTTP errors (unknown route, wrong method...) to the contract."""
    assert isinstance(exc, StarletteHTTPException)
    cls = _BY_STATUS.get(exc.status_code)
    if cls is NotFound:
        err: ReplayError = NotFound(f"no route {request.method} {request.url.path}")
    elif cls is MethodNotAllowed:
        err = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
    elif cls is not None:
        err = cls(str(exc.detail))
    else:
        err = ReplayError(str(exc.detail))
    _remember_code(request, err)
    response = error_response(
        err, msgpack_body=_wants_msgpack(request), headers=dict(exc.headers or {})
    )
    if cls is None:
        response.status_code = exc.status_code
    return response


def _location(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(part) for part in loc) or "request"


async def validation_error_handler(request: Request, exc: Exception) -> Response:
    """Maps FastAPI's request validation errors: 400 for malformed input, 422 otherwise."""
    assert isinstance(exc, RequestValidationError)
    problems = list(exc.errors())
    message = "; ".join(
        f"{_location(p.get('loc', ()))}: {p.get('msg', 'invalid')}" for p in problems
    )
    malformed = any(p.get("type") == "json_invalid" for p in problems)
    err: ReplayError = BadRequest(message) if malformed else ValidationFailed(message)
    _remember_code(request, err)
    return error_response(err, msgpack_body=_wants_msgpack(request))


def install_error_handlers(app: FastAPI) -> None:
    """Registers the handlers above on ``app``."""
    app.add_exception_handler(ReplayError, replay_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_exception_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
