"""Content negotiation: which format a request body is in, which one the answer takes.

Bodies are ``application/json`` or ``application/msgpack`` (``application/x-msgpack`` too);
anything else is 415. Answers are msgpack when the request's ``Accept`` names msgpack and
JSON otherwise. Routes read bodies themselves and decode them with the wire schemas
(:mod:`rlreplay.app.api.bodies`), so that item values can stay raw msgpack bytes.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

import msgpack
from fastapi import Request
from starlette.responses import Response

from rlreplay.app.api.errors import wants_msgpack_header
from rlreplay.app.api.gathered_writes import AnswerPieces
from rlreplay.wire.codec import spell_floats
from rlreplay.wire.errors import BadRequest, UnsupportedMediaType

__all__ = [
    "JSON",
    "MSGPACK",
    "BodyFormat",
    "Reply",
    "body_format",
    "decode_body",
    "dump_json",
    "encode",
    "encode_reply",
    "format_of",
    "read_body",
    "wants_msgpack",
]

JSON = "application/json"
MSGPACK = "application/msgpack"
_MSGPACK_TYPES = frozenset({"application/msgpack", "application/x-msgpack"})


class BodyFormat(enum.Enum):
    """The encoding of a request body."""

    JSON = "json"
    MSGPACK = "msgpack"


def body_format(request: Request) -> BodyFormat:
    """The format named by the request's ``Content-Type``; 415 for anything else."""
    return format_of(request.headers.get("content-type", ""))


def format_of(content_type: str) -> BodyFormat:
    """The format named by a ``Content-Type`` value; 415 for anything else.

    Args:
        content_type: The header's value ("" when missing).

    Returns:
        JSON or msgpack.

    Raises:
        UnsupportedMediaType: The content type is neither (or missing).
    """
    media_type = content_type.partition(";")[0].strip().lower()
    if media_type in _MSGPACK_TYPES:
        return BodyFormat.MSGPACK
    if media_type == JSON or (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        return BodyFormat.JSON
    shown = media_type or "no Content-Type"
    raise UnsupportedMediaType(
        f"{shown} is not supported; send application/json or application/msgpack"
    )


def wants_msgpack(request: Request) -> bool:
    """Whether the answer should be msgpack (the ``Accept`` header names it)."""
    return wants_msgpack_header(request.headers.get("accept"))


async def read_body(request: Request) -> tuple[bytes, BodyFormat]:
    """The request's raw body and its format (the format is checked before reading)."""
    fmt = body_format(request)
    return await request.body(), fmt


def decode_body(body: bytes, fmt: BodyFormat) -> Any:
    """Decodes a whole body into Python objects; 400 when it is malformed.

    Args:
        body: The raw body.
        fmt: Its format.

    Returns:
        The decoded object (msgpack extension types stay :class:`msgpack.ExtType`).

    Raises:
        BadRequest: The body is not valid JSON or msgpack.
    """
    if not body:
        raise BadRequest("the request body is empty")
    try:
        if fmt is BodyFormat.JSON:
            return json.loads(body)
        return msgpack.unpackb(body, raw=False)
    except (ValueError, msgpack.UnpackException, RecursionError) as exc:
        raise BadRequest(f"malformed {fmt.value} body: {exc}") from exc


def dump_json(data: Any) -> bytes:
    """Compact JSON bytes; NaN and infinities, which JSON cannot spell, as ``{"$float": ...}``.

    The encoder refuses those floats (``allow_nan=False``), and only then is ``data`` walked
    to replace them (:func:`~rlreplay.wire.codec.spell_floats`): answers without one, nearly all
    of them, pay nothing for the check.
    """
    try:
        return _dumps(data)
    except ValueError:  # "Out of range float values are not JSON compliant"
        return _dumps(spell_floats(data))


def _dumps(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True, slots=True)
class Reply:
    """A finished answer: status, encoded body and media type.

    The data routes build a ``Reply`` from the request's raw body, so the same code serves
    them through FastAPI (:meth:`response`) and through :mod:`rlreplay.app.api.hot`.
    """

    #: memoryview: an answer written into a buffer of its own; AnswerPieces: an answer
    #: sent from where its bytes lie (see :mod:`rlreplay.app.api.gathered_writes`)
    body: bytes | memoryview | AnswerPieces
    media_type: str
    status: int = 200

    def response(self) -> Response:
        """The answer as a Starlette response."""
        body = self.body.join() if type(self.body) is AnswerPieces else self.body
        return Response(body, status_code=self.status, media_type=self.media_type)


def encode_reply(data: Any, *, msgpack_body: bool, status: int = 200) -> Reply:
    """A :class:`Reply` carrying plain ``data`` as msgpack or JSON."""
    if msgpack_body:
        return Reply(msgpack.packb(data), MSGPACK, status)
    return Reply(dump_json(data), JSON, status)


def encode(
    data: Any, *, msgpack_body: bool, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """A response carrying ``data`` as msgpack or JSON.

    Args:
        data: Plain data (dicts, lists, strings, numbers, None).
        msgpack_body: msgpack when true, JSON otherwise.
        status_code: The HTTP status.
        headers: Extra headers.

    Returns:
        The response.
    """
    if msgpack_body:
        return Response(
            msgpack.packb(data), status_code=status_code, media_type=MSGPACK, headers=headers
        )
    return Response(dump_json(data), status_code=status_code, media_type=JSON, headers=headers)
