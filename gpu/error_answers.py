"""The contract's error body, in JSON or msgpack as the request's ``Accept`` asks."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from starlette.responses import Response

from rlreplay.wire.codec import packb
from rlreplay.wire.errors import ReplayError

__all__ = ["JSON", "MSGPACK", "error_answer", "wants_msgpack"]

MSGPACK = "application/msgpack"
JSON = "application/json"


def wants_msgpack(accept: str | None) -> bool:
    """Whether an ``Accept`` header asks for msgpack."""
    return accept is not None and "msgpack" in accept


def error_answer(
    exc: ReplayError, *, as_msgpack: bool, headers: Mapping[str, str] | None = None
) -> Response:
    """``exc`` as the contract's error answer: its status, ``{"error": {"code", "message"}}``."""
    body = exc.to_body()
    if as_msgpack:
        return Response(packb(body), exc.status, headers, media_type=MSGPACK)
    return Response(msgspec.json.encode(body), exc.status, headers, media_type=JSON)
