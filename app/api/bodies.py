"""The contract's request bodies, decoded from JSON or msgpack with the wire schemas.

Each body is decoded in one call by msgspec into its Struct of :mod:`rlreplay.wire.schemas`,
which checks its fields' types and bounds. The contract splits refusals in two:

* a body that is not valid JSON or msgpack, is not a map, or has a field of the wrong type
  is 400 ``bad_request``;
* a well-formed body with a missing required field, an unknown field or a value out of range
  (a key of 0 or over 512 bytes, a negative or non-finite priority, ``batch_size`` 0) is 422
  ``validation_error``.

msgspec reports both kinds as a :class:`msgspec.ValidationError` that names the field; its
message tells them apart (:func:`schema_refusal`). What the Structs cannot state is checked here:

* a key's limit is 512 bytes of UTF-8, while the schema bounds characters;
* an infinite priority (``Meta(ge=0)`` already refuses NaN);
* a field that a msgpack push body names twice (msgspec keeps the last; the contract refuses);
* ``8.0`` is an integer, as in JSON Schema (msgspec refuses a float for an ``int`` field);
* JSON that Python's parser reads and msgspec's does not (the ``NaN`` and ``Infinity``
  literals, unpaired surrogates, UTF-16): such a body is read by :func:`json.loads`, as the
  server always read it, and then checked by :func:`msgspec.convert` against the same Struct.

Push bodies in msgpack keep each item's ``value`` as the raw bytes the client sent
(:class:`msgspec.Raw`, copied out of the body): it is stored as is, never decoded, and the
write-ahead log keeps the body itself rather than the items encoded again. JSON values, in
the contract's JSON form, are converted to msgpack
(:func:`~rlreplay.wire.codec.jsonable_to_msgpack`).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from msgspec import UNSET
from pydantic import ValidationError

from rlreplay.app.api.encoding import BodyFormat, decode_body
from rlreplay.app.tables.config import TableConfig, check_numbers
from rlreplay.app.tables.items import NewItem
from rlreplay.app.tables.tag_index import check_tags
from rlreplay.wire.codec import jsonable_to_msgpack
from rlreplay.wire.errors import BadRequest, ValidationFailed
from rlreplay.wire.headers import map_size
from rlreplay.wire.schemas import (
    MAX_KEY_BYTES,
    DeleteRequest,
    KeysRequest,
    PrioritiesRequest,
    PushRequest,
    SampleRequest,
    SnapshotRequest,
)
from rlreplay.wire.window_schemas import WindowPrioritiesRequest, WindowSampleRequest

__all__ = [
    "PushBody",
    "check_finite",
    "check_key",
    "check_keys",
    "decode_struct",
    "item_value_msgpack",
    "parse_delete",
    "parse_keys",
    "parse_priorities",
    "parse_push",
    "parse_sample",
    "parse_snapshot",
    "parse_table_config",
    "parse_window_priorities",
    "parse_window_sample",
    "schema_refusal",
]

_MAX_FLOAT = sys.float_info.max
#: msgspec's message for a value of the wrong type (``Expected `int`, got `str` - at ...``);
#: its other messages are about values out of range, missing and unknown fields.
_WRONG_TYPE = re.compile(r"Expected `[^`]+`, got `[^`]+`")
_FLOAT_FOR_INT = "Expected `int`, got `float`"
#: What msgspec raises for bytes it cannot read (invalid UTF-8 is a UnicodeDecodeError).
_UNREADABLE = (msgspec.DecodeError, ValueError, RecursionError)

_Body = TypeVar("_Body", bound=msgspec.Struct)


@dataclass(frozen=True, slots=True)
class PushBody:
    """A decoded push body: the items to push and whether to wait for the writer."""

    items: list[NewItem]
    wait: bool
    #: The body itself when it is msgpack (the write-ahead log keeps it as sent, instead of
    #: encoding the items again); None for JSON.
    raw: bytes | memoryview | None = field(default=None, compare=False)
    #: The write's idempotency key, if it has one.
    request_id: str | None = None
    #: A msgpack columnar body's ``columns`` map as sent (the log keeps it, and replay
    #: builds the values from it again); None otherwise.
    columns: memoryview | None = field(default=None, compare=False)
    #: The reservation whose slots these items fill, if any.
    reservation: str | None = None


class _PushRequestWithWait(PushRequest):
    """A msgpack push body whose map has two entries: requiring ``wait`` proves that they are
    ``items`` and ``wait``, not ``items`` twice."""

    wait: bool


class _PushRequestSaysWait(PushRequest):
    """A msgpack push body of three or more entries: ``wait`` unset tells whether it was
    given, so that the fields given can be counted against the map's entries."""

    wait: bool | msgspec.UnsetType = msgspec.UNSET  # type: ignore[assignment]


_JSON_PUSH = msgspec.json.Decoder(PushRequest)
_MSGPACK_PUSH = msgspec.msgpack.Decoder(PushRequest)
_MSGPACK_PUSH_WITH_WAIT = msgspec.msgpack.Decoder(_PushRequestWithWait)
_MSGPACK_PUSH_SAYS_WAIT = msgspec.msgpack.Decoder(_PushRequestSaysWait)


class _Decoders:
    """The JSON and msgpack decoders of one request Struct."""

    def __init__(self, struct: type[msgspec.Struct], *, integral_floats: bool = False) -> None:
        self.struct = struct
        self.json = msgspec.json.Decoder(struct)
        self.msgpack = msgspec.msgpack.Decoder(struct)
        #: Whether the Struct has integer fields, which take a float with no fraction.
        self.integral_floats = integral_floats


_KEYS = _Decoders(KeysRequest)
_DELETE = _Decoders(DeleteRequest)
_SAMPLE = _Decoders(SampleRequest, integral_floats=True)
_PRIORITIES = _Decoders(PrioritiesRequest)
_SNAPSHOT = _Decoders(SnapshotRequest)
_WINDOW_SAMPLE = _Decoders(WindowSampleRequest, integral_floats=True)
_WINDOW_PRIORITIES = _Decoders(WindowPrioritiesRequest, integral_floats=True)


# --- refusals ---------------------------------------------------------------------------------


def schema_refusal(exc: msgspec.ValidationError) -> BadRequest | ValidationFailed:
    """The contract's error for msgspec's refusal: 400 for a wrong type, 422 otherwise."""
    message = str(exc)
    if _WRONG_TYPE.match(message):
        return BadRequest(message)
    return ValidationFailed(message)


def _convert(obj: Any, struct: type[_Body], *, integral_floats: bool = False) -> _Body:
    """``obj``, decoded without a type, checked against ``struct`` as the decoder checks."""
    if integral_floats and isinstance(obj, dict):
        obj = {key: _integer(value) for key, value in obj.items()}
    try:
        return msgspec.convert(obj, struct)
    except msgspec.ValidationError as exc:
        raise schema_refusal(exc) from None
    except RecursionError as exc:
        raise BadRequest("the body is nested too deep") from exc


def _integer(value: Any) -> Any:
    """A float with no fraction as an int, as JSON Schema counts it; any other value as is.

    Only a body's own fields are looked at: the Structs' int fields are all there.
    """
    if type(value) is float and value.is_integer():
        return int(value)
    return value


def _decode(body: bytes, fmt: BodyFormat, decoders: _Decoders) -> Any:
    """A body decoded with its Struct; the contract's error when it is refused."""
    if not body:
        raise BadRequest("the request body is empty")
    decoder = decoders.msgpack if fmt is BodyFormat.MSGPACK else decoders.json
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        if not (decoders.integral_floats and str(exc).startswith(_FLOAT_FOR_INT)):
            raise schema_refusal(exc) from None
    except _UNREADABLE as exc:
        if fmt is BodyFormat.MSGPACK:
            raise BadRequest(f"malformed msgpack body: {exc}") from exc
    # a float given for an int, or JSON only Python's parser reads: read it as before
    return _convert(
        decode_body(body, fmt), decoders.struct, integral_floats=decoders.integral_floats
    )


# --- keys and priorities: what the schema cannot bound ----------------------------------------


def check_key(key: object, where: str = "key") -> str:
    """A valid item key: a string of 1 to 512 bytes of UTF-8.

    Args:
        key: The decoded key.
        where: Where it was found, for the error message.

    Returns:
        The key.

    Raises:
        BadRequest: Not a string.
        ValidationFailed: Empty, over 512 bytes, or not encodable as UTF-8.
    """
    if type(key) is not str:
        raise BadRequest(f"{where} must be a string, not {_kind(key)}")
    if not key:
        raise ValidationFailed(f"{where} must not be empty")
    if not key.isascii():
        _check_utf8(key, where)
    elif len(key) > MAX_KEY_BYTES:
        raise ValidationFailed(f"{where} is {len(key)} bytes of UTF-8; the limit is 512")
    return key


def _check_utf8(key: str, where: str) -> None:
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:  # an unpaired surrogate, from JSON's \ud800 escapes
        raise ValidationFailed(f"{where} is not valid UTF-8") from exc
    if size > MAX_KEY_BYTES:
        raise ValidationFailed(f"{where} is {size} bytes of UTF-8; the limit is 512")


def check_keys(keys: list[str], where: Callable[[int], str]) -> None:
    """Keys the schema accepted (1 to 512 characters), checked in bytes of UTF-8.

    ASCII keys, nearly all of them, are as long in bytes as in characters; the others are
    encoded one by one.
    """
    if "".join(keys).isascii():
        return
    for i, key in enumerate(keys):
        if not key.isascii():
            _check_utf8(key, where(i))


def check_finite(priorities: list[float], where: Callable[[int], str]) -> None:
    """Priorities the schema accepted (>= 0, not NaN), checked for infinity."""
    if priorities and max(priorities) > _MAX_FLOAT:
        i = next(i for i, p in enumerate(priorities) if p > _MAX_FLOAT)
        raise ValidationFailed(f"{where(i)} must be a finite number >= 0, not inf")


def _kind(value: object) -> str:
    names = {dict: "a map", list: "a list", str: "a string", bytes: "bytes", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), type(value).__name__)


def _item_key(i: int) -> str:
    return f"items[{i}].key"


def _item_priority(i: int) -> str:
    return f"items[{i}].priority"


# --- push -------------------------------------------------------------------------------------


def parse_push(body: bytes | memoryview, fmt: BodyFormat) -> PushBody:
    """Parses a push body; msgpack values stay the raw bytes sent, JSON values are converted.

    Args:
        body: The raw request body.
        fmt: Its format.

    Returns:
        The items to push and whether to wait for the writer.

    Raises:
        BadRequest: Malformed, or a field of the wrong type.
        ValidationFailed: A missing, unknown or repeated field, a bad key or priority.
    """
    if not body:
        raise BadRequest("the request body is empty")
    if fmt is BodyFormat.MSGPACK:
        push = _decode_msgpack_push(body)
        values = [bytes(it.value) for it in push.items]
    else:
        push, values = _decode_json_push(bytes(body))
    items = push.items
    keys = [it.key for it in items]
    priorities = [it.priority for it in items]
    check_keys(keys, _item_key)
    check_finite(priorities, _item_priority)
    if any(
        it.group is not UNSET or it.version is not UNSET or it.tags is not UNSET for it in items
    ):
        new_items = [
            NewItem(
                k,
                v,
                p,
                None if it.group is UNSET else it.group,
                None if it.version is UNSET else it.version,
                None if it.tags is UNSET else check_tags(it.tags, f"items[{i}].tags") or None,
            )
            for i, (k, v, p, it) in enumerate(zip(keys, values, priorities, items, strict=True))
        ]
    else:
        new_items = list(map(NewItem, keys, values, priorities))
    return PushBody(
        new_items,
        bool(push.wait),
        body if fmt is BodyFormat.MSGPACK else None,
        None if push.request_id is UNSET else push.request_id,
        reservation=None if push.reservation is UNSET else push.reservation,
    )


def _decode_msgpack_push(body: bytes | memoryview) -> PushRequest:
    size = map_size(body)
    # a map of two entries must hold both fields, so that a repeated "items" is refused
    decoder: msgspec.msgpack.Decoder[Any] = _MSGPACK_PUSH_WITH_WAIT if size == 2 else _MSGPACK_PUSH
    if size is not None and size > 2:
        decoder = _MSGPACK_PUSH_SAYS_WAIT
    try:
        push: PushRequest = decoder.decode(body)
    except msgspec.ValidationError as exc:
        if size == 2 and str(exc) == "Object missing required field `wait`":
            push = _decode_items_and_id(body)
        else:
            raise schema_refusal(exc) from None
    except _UNREADABLE as exc:
        raise BadRequest(f"malformed msgpack push body: {exc}") from exc
    if size is not None and size > 2:  # every name is known: count those given
        wait: Any = push.wait
        given = 1 + (wait is not UNSET) + (push.request_id is not UNSET)
        given += push.reservation is not UNSET
        if given != size:
            raise ValidationFailed("duplicate field(s) in the body")
    return push


def _decode_items_and_id(body: bytes | memoryview) -> PushRequest:
    """A msgpack push body of two entries without ``wait``: ``items`` and ``request_id``
    or ``reservation``, or ``items`` twice (refused)."""
    try:
        push: PushRequest = _MSGPACK_PUSH.decode(body)
    except msgspec.ValidationError as exc:
        raise schema_refusal(exc) from None
    except _UNREADABLE as exc:
        raise BadRequest(f"malformed msgpack push body: {exc}") from exc
    if push.request_id is UNSET and push.reservation is UNSET:
        raise ValidationFailed("duplicate field in the body: items")
    return push


def _decode_json_push(body: bytes) -> tuple[PushRequest, list[bytes]]:
    """A JSON push body and its items' values converted to msgpack."""
    try:
        push = _JSON_PUSH.decode(body)
    except msgspec.ValidationError as exc:
        if not str(exc).startswith(_FLOAT_FOR_INT):
            raise schema_refusal(exc) from None
        # an item's version given as 8.0: an integer, as JSON Schema counts it
        obj = decode_body(body, BodyFormat.JSON)
        for entry in obj.get("items", []) if isinstance(obj, dict) else []:
            if isinstance(entry, dict) and "version" in entry:
                entry["version"] = _integer(entry["version"])
        push, forms = _convert_json_push(obj)
    except _UNREADABLE:
        # JSON that only Python's parser reads: the values are its, the rest is checked
        push, forms = _convert_json_push(decode_body(body, BodyFormat.JSON))
    else:
        forms = [_json_form(bytes(it.value), i) for i, it in enumerate(push.items)]
    return push, [_value_msgpack(form, i) for i, form in enumerate(forms)]


#: Stands for a value while the rest of a push body read by json.loads is checked.
_PLACEHOLDER = msgspec.Raw(b"null")


def _convert_json_push(obj: Any) -> tuple[PushRequest, list[Any]]:
    """A push body read by :func:`json.loads`, checked against :class:`PushRequest`, and its
    items' values (which :func:`msgspec.convert` cannot make :class:`msgspec.Raw`)."""
    forms: list[Any] = []
    entries = obj.get("items") if isinstance(obj, dict) else None
    if isinstance(entries, list):
        for entry in entries:
            if isinstance(entry, dict) and "value" in entry:
                forms.append(entry["value"])
                entry["value"] = _PLACEHOLDER
    # once it converts, every item had a value: forms[i] is the value of items[i]
    return _convert(obj, PushRequest), forms


def _json_form(text: bytes, i: int) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"items[{i}].value: malformed json: {exc}") from exc


def item_value_msgpack(text: bytes, i: int) -> bytes:
    """The msgpack bytes of ``items[i]``'s value sent as JSON text: 400 for malformed JSON,
    422 for an integer past 64 bits, as the contract says."""
    return _value_msgpack(_json_form(text, i), i)


def _value_msgpack(form: Any, i: int) -> bytes:
    """The msgpack bytes of a value in the contract's JSON form."""
    try:
        return jsonable_to_msgpack(form)
    except (ValueError, TypeError, RecursionError) as exc:
        if isinstance(exc.__cause__, OverflowError):  # well formed, but past 64 bits
            raise ValidationFailed(f"items[{i}].value: an integer does not fit in 64 bits") from exc
        raise BadRequest(f"items[{i}].value: {exc}") from exc


# --- keys, deletes, samples, priorities -------------------------------------------------------


def _key_at(i: int) -> str:
    return f"keys[{i}]"


def parse_keys(body: bytes, fmt: BodyFormat) -> KeysRequest:
    """Parses ``{"keys": [...]}`` (batchGet)."""
    request: KeysRequest = _decode(body, fmt, _KEYS)
    check_keys(request.keys, _key_at)
    return request


def parse_delete(body: bytes, fmt: BodyFormat) -> DeleteRequest:
    """Parses ``{"keys": [...], "wait"?: false}`` (batchDelete)."""
    request: DeleteRequest = _decode(body, fmt, _DELETE)
    check_keys(request.keys, _key_at)
    return request


def parse_sample(body: bytes, fmt: BodyFormat) -> SampleRequest:
    """Parses ``{"batch_size", "timeout_ms"?, "include_values"?}``."""
    request: SampleRequest = _decode(body, fmt, _SAMPLE)
    return request


def parse_priorities(body: bytes, fmt: BodyFormat) -> PrioritiesRequest:
    """Parses ``{"priorities": {key: priority, ...}}``."""
    request: PrioritiesRequest = _decode(body, fmt, _PRIORITIES)
    keys = list(request.priorities)
    check_keys(keys, lambda i: "a key of priorities")
    check_finite(list(request.priorities.values()), lambda i: f"priorities[{keys[i]!r}]")
    return request


def parse_window_sample(body: bytes, fmt: BodyFormat) -> WindowSampleRequest:
    """Parses an episode table's sample body (:class:`WindowSampleRequest`)."""
    request: WindowSampleRequest = _decode(body, fmt, _WINDOW_SAMPLE)
    return request


def parse_window_priorities(body: bytes, fmt: BodyFormat) -> WindowPrioritiesRequest:
    """Parses ``{"windows": [{"episode", "start", "priority" | "td"}], "eta"?}``."""
    request: WindowPrioritiesRequest = _decode(body, fmt, _WINDOW_PRIORITIES)
    check_keys([w.episode for w in request.windows], lambda i: f"windows[{i}].episode")
    return request


def parse_snapshot(body: bytes, fmt: BodyFormat | None) -> SnapshotRequest:
    """Parses ``{"tables"?: [...]}``; an empty body snapshots every table."""
    if not body or fmt is None:
        return SnapshotRequest()
    request: SnapshotRequest = _decode(body, fmt, _SNAPSHOT)
    return request


# --- any request Struct ------------------------------------------------------------------


def decode_struct(body: bytes, fmt: BodyFormat, struct: type[_Body]) -> _Body:
    """A body of any request Struct, refused as the contract says (integral floats are ints)."""
    decoders = _STRUCT_DECODERS.get(struct)
    if decoders is None:
        decoders = _STRUCT_DECODERS[struct] = _Decoders(struct, integral_floats=True)
    request: _Body = _decode(body, fmt, decoders)
    return request


_STRUCT_DECODERS: dict[type[msgspec.Struct], _Decoders] = {}


# --- table configs ----------------------------------------------------------------------------

_TYPE_ERRORS = ("_type", "_parsing")


def parse_table_config(body: bytes, fmt: BodyFormat | None) -> TableConfig:
    """Parses a ``TableConfig``; an empty body is the default config.

    Args:
        body: The raw body (may be empty).
        fmt: Its format, None when the body is empty.

    Returns:
        The config.

    Raises:
        BadRequest: Malformed, or a field of the wrong type.
        ValidationFailed: A value out of range or an unknown field.
    """
    if not body or fmt is None:
        return TableConfig.model_validate({})
    obj = decode_body(body, fmt)
    if not isinstance(obj, dict):
        raise BadRequest(f"the body must be a map, not {_kind(obj)}")
    try:
        check_numbers(obj, "")
    except ValueError as exc:
        raise ValidationFailed(str(exc)) from exc
    try:
        return TableConfig.model_validate(obj)
    except ValidationError as exc:
        problems = exc.errors(include_url=False)
        message = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in problems
        )
        if any(str(e["type"]).endswith(_TYPE_ERRORS) for e in problems):
            raise BadRequest(message) from exc
        raise ValidationFailed(message) from exc
