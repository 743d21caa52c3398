"""The contract's request bodies, parsed and validated from JSON or msgpack.

Rules shared by every body:

* a body that is not valid JSON or msgpack, is not a map, or has a field of the wrong type
  is 400 ``bad_request``;
* a well-formed body with a missing required field, an unknown field or a value out of range
  (a key of 0 or over 512 bytes, a negative or non-finite priority, ``batch_size`` 0) is 422
  ``validation_error``.

Push bodies in msgpack keep each item's ``value`` as the raw bytes the client sent: it is
stored as is, never decoded. The common body (``{"items": [...]}``, optionally with
``wait``, short ASCII keys, finite priorities) is decoded in one C call by msgspec
(:func:`rlreplay.app.tables.items.decode_push_body`, which the log's replay shares: such a body is
logged as sent), the values as :class:`msgspec.Raw` spans copied out; any other body is
walked with :class:`msgpack.Unpacker`, which alone decides errors, so both give the same
answer to every body (the fast path only takes bodies the walk accepts, with the same
result).
The fast path is about 20 µs for 64 items of 4 KiB, against 75 µs for the walk.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
from pydantic import ValidationError

from rlreplay.app.api.encoding import BodyFormat, decode_body
from rlreplay.app.tables.config import TableConfig, check_numbers
from rlreplay.app.tables.items import MAX_KEY_BYTES, NewItem, decode_push_body
from rlreplay.wire.codec import jsonable_to_msgpack
from rlreplay.wire.errors import BadRequest, ValidationFailed

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "MAX_BATCH_SIZE",
    "MAX_TIMEOUT_MS",
    "DeleteBody",
    "KeysBody",
    "PrioritiesBody",
    "PushBody",
    "SampleBody",
    "check_key",
    "parse_delete",
    "parse_keys",
    "parse_priorities",
    "parse_push",
    "parse_sample",
    "parse_table_config",
]

#: Largest ``batch_size`` of one sample request.
MAX_BATCH_SIZE = 65_536
#: ``timeout_ms`` of a sample request that names none.
DEFAULT_TIMEOUT_MS = 10_000
#: Longest ``timeout_ms`` accepted (ten minutes).
MAX_TIMEOUT_MS = 600_000

_DECODE_ERRORS = (ValueError, TypeError, msgpack.UnpackException, RecursionError)
#: A key of at most this many ASCII characters is within the 512-byte limit.
_ASCII_KEY_CHARS = MAX_KEY_BYTES
_MAX_FLOAT = sys.float_info.max


@dataclass(frozen=True, slots=True)
class PushBody:
    """``{"items": [{"key", "value", "priority"?}], "wait"?: false}``."""

    items: list[NewItem]
    wait: bool
    #: The body itself when it has the common msgpack form (the write-ahead log keeps it
    #: as sent, instead of encoding the items again); None otherwise.
    raw: bytes | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class KeysBody:
    """``{"keys": [...]}`` of a batchGet."""

    keys: list[str]


@dataclass(frozen=True, slots=True)
class DeleteBody:
    """``{"keys": [...], "wait"?: false}`` of a batchDelete."""

    keys: list[str]
    wait: bool


@dataclass(frozen=True, slots=True)
class SampleBody:
    """``{"batch_size", "timeout_ms"?, "include_values"?}``."""

    batch_size: int
    timeout_ms: int
    include_values: bool


@dataclass(frozen=True, slots=True)
class PrioritiesBody:
    """``{"priorities": {key: priority}}``."""

    priorities: dict[str, float]


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
    n = len(key)
    if n == 0:
        raise ValidationFailed(f"{where} must not be empty")
    if n > MAX_KEY_BYTES // 4:
        try:
            size = len(key.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ValidationFailed(f"{where} is not valid UTF-8") from exc
        if size > MAX_KEY_BYTES:
            raise ValidationFailed(f"{where} is {size} bytes of UTF-8; the limit is 512")
    elif not key.isascii():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValidationFailed(f"{where} is not valid UTF-8") from exc
    return key


def check_priority(value: object, where: str = "priority") -> float:
    """A valid priority: a finite number ≥ 0 (booleans are not numbers here)."""
    if type(value) is float:
        priority = value
    elif type(value) is int:
        try:
            priority = float(value)
        except OverflowError:  # an integer past a float's range
            raise ValidationFailed(
                f"{where} must be a finite number >= 0, not an integer of {value.bit_length()} bits"
            ) from None
    else:
        raise BadRequest(f"{where} must be a number, not {_kind(value)}")
    if not (priority >= 0.0 and math.isfinite(priority)):
        raise ValidationFailed(f"{where} must be a finite number >= 0, not {value}")
    return priority


def _kind(value: object) -> str:
    names = {dict: "a map", list: "a list", str: "a string", bytes: "bytes", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), type(value).__name__)


def _as_map(obj: object, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise BadRequest(f"{what} must be a map, not {_kind(obj)}")
    return obj


def _fields(obj: dict[str, Any], *, required: set[str], allowed: set[str], what: str) -> None:
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:
        raise ValidationFailed(f"unknown field(s) in {what}: {', '.join(unknown)}")
    missing = sorted(required - obj.keys())
    if missing:
        raise ValidationFailed(f"missing field(s) in {what}: {', '.join(missing)}")


def _bool(value: object, where: str) -> bool:
    if type(value) is not bool:
        raise BadRequest(f"{where} must be a boolean, not {_kind(value)}")
    return value


def _int(value: object, where: str, *, low: int, high: int) -> int:
    if type(value) is float and value.is_integer():  # JSON Schema: 8.0 is an integer
        value = int(value)
    if type(value) is not int:
        raise BadRequest(f"{where} must be an integer, not {_kind(value)}")
    if not low <= value <= high:
        raise ValidationFailed(f"{where} must be between {low} and {high}, not {value}")
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise BadRequest(f"{where} must be a list, not {_kind(value)}")
    return value


# --- push -------------------------------------------------------------------------------------

_ITEM_FIELDS = {"key", "value", "priority"}
_PUSH_FIELDS = {"items", "wait"}


def parse_push(body: bytes, fmt: BodyFormat) -> PushBody:
    """Parses a push body; msgpack values stay the raw bytes sent, JSON values are converted.

    Args:
        body: The raw request body.
        fmt: Its format.

    Returns:
        The items to push and whether to wait for the writer.

    Raises:
        BadRequest: Malformed, or a field of the wrong type.
        ValidationFailed: A missing or unknown field, a bad key or priority.
    """
    if fmt is BodyFormat.MSGPACK:
        fast = _parse_push_fast(body)
        return fast if fast is not None else _walk_push(body)
    obj = _as_map(decode_body(body, fmt), "the body")
    _fields(obj, required={"items"}, allowed=_PUSH_FIELDS, what="the body")
    wait = _bool(obj.get("wait", False), "wait")
    items = []
    for i, raw in enumerate(_list(obj["items"], "items")):
        where = f"items[{i}]"
        entry = _as_map(raw, where)
        _fields(entry, required={"key", "value"}, allowed=_ITEM_FIELDS, what=where)
        key = check_key(entry["key"], f"{where}.key")
        priority = check_priority(entry.get("priority", 1.0), f"{where}.priority")
        try:
            value = jsonable_to_msgpack(entry["value"])
        except (ValueError, TypeError, RecursionError) as exc:
            if isinstance(exc.__cause__, OverflowError):  # well formed, but past 64 bits
                raise ValidationFailed(
                    f"{where}.value: an integer does not fit in 64 bits"
                ) from exc
            raise BadRequest(f"{where}.value: {exc}") from exc
        items.append(NewItem(key, value, priority))
    return PushBody(items, wait)


def _parse_push_fast(body: bytes) -> PushBody | None:
    """The common push body decoded by msgspec, or None: then the walk decides."""
    decoded = decode_push_body(body)
    if decoded is None:
        return None
    fast_items, wait = decoded
    if not fast_items:
        return PushBody([], wait)
    keys = [it.key for it in fast_items]
    priorities = [it.priority for it in fast_items]
    # the walk's own fast acceptance: keys of 1 to 512 ASCII characters, priorities finite
    # and >= 0 (a NaN or infinity makes the sum non-finite; an overflowing sum of finite
    # priorities only sends the body to the walk, which accepts it)
    if not (
        "".join(keys).isascii()
        and min(map(len, keys)) > 0
        and max(map(len, keys)) <= _ASCII_KEY_CHARS
        and min(priorities) >= 0.0
        and math.isfinite(sum(priorities))
    ):
        return None
    values = [bytes(it.value) for it in fast_items]
    return PushBody(list(map(NewItem, keys, values, priorities)), wait, body)


def _walk_push(body: bytes) -> PushBody:
    """Any msgpack push body, walked field by field; raises the contract's errors."""
    try:
        return _walk_push_fields(body)
    except (BadRequest, ValidationFailed):
        raise
    except _DECODE_ERRORS as exc:
        raise BadRequest(f"malformed msgpack push body: {exc}") from exc


def _walk_push_fields(body: bytes) -> PushBody:
    if not body:
        raise BadRequest("the request body is empty")
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(body), 1024))
    unpacker.feed(body)
    n_fields = _map_header(unpacker, "the body")
    items: list[NewItem] | None = None
    wait = False
    seen: set[str] = set()
    for _ in range(n_fields):
        name = unpacker.unpack()
        if name in seen:
            raise ValidationFailed(f"duplicate field in the body: {name}")
        if name == "items":
            items = _msgpack_items(unpacker, body)
        elif name == "wait":
            wait = _bool(unpacker.unpack(), "wait")
        else:
            raise ValidationFailed(f"unknown field(s) in the body: {name}")
        seen.add(name)
    if unpacker.tell() != len(body):
        raise BadRequest("trailing bytes after the msgpack body")
    if items is None:
        raise ValidationFailed("missing field(s) in the body: items")
    return PushBody(items, wait)


def _map_header(unpacker: msgpack.Unpacker, what: str) -> int:
    try:
        n: int = unpacker.read_map_header()
    except ValueError as exc:
        raise BadRequest(f"{what} must be a map") from exc
    return n


def _msgpack_items(unpacker: msgpack.Unpacker, body: bytes) -> list[NewItem]:
    """The items of a msgpack push body, each ``value`` the raw bytes sent.

    This loop runs per pushed item, so its common case is kept cheap: the unpacker's methods
    are bound once, and a key that is short ASCII and a priority that is a finite float >= 0
    are accepted as they are; anything else goes to :func:`check_key` and
    :func:`check_priority`, which normalise it or raise with the item's position.
    """
    try:
        count: int = unpacker.read_array_header()
    except ValueError as exc:
        raise BadRequest("items must be a list") from exc
    read_map_header, unpack, skip, tell = (
        unpacker.read_map_header,
        unpacker.unpack,
        unpacker.skip,
        unpacker.tell,
    )
    items = []
    for i in range(count):
        try:
            n_fields: int = read_map_header()
        except ValueError as exc:
            raise BadRequest(f"items[{i}] must be a map") from exc
        key: object = None
        value: bytes | None = None
        priority: object = 1.0
        for _ in range(n_fields):
            name = unpack()
            if name == "key":
                key = unpack()
            elif name == "value":
                start = tell()
                skip()
                value = body[start : tell()]
            elif name == "priority":
                priority = unpack()
            else:
                raise ValidationFailed(f"unknown field(s) in items[{i}]: {name}")
        if key is None or value is None:
            missing = [f for f, v in (("key", key), ("value", value)) if v is None]
            raise ValidationFailed(f"missing field(s) in items[{i}]: {', '.join(missing)}")
        items.append(
            NewItem(
                key
                if type(key) is str and 0 < len(key) <= _ASCII_KEY_CHARS and key.isascii()
                else check_key(key, f"items[{i}].key"),
                value,
                priority
                if type(priority) is float and 0.0 <= priority <= _MAX_FLOAT
                else check_priority(priority, f"items[{i}].priority"),
            )
        )
    return items


# --- keys, deletes, samples, priorities -------------------------------------------------------


def _keys(obj: dict[str, Any]) -> Iterator[str]:
    for i, key in enumerate(_list(obj["keys"], "keys")):
        yield check_key(key, f"keys[{i}]")


def parse_keys(body: bytes, fmt: BodyFormat) -> KeysBody:
    """Parses ``{"keys": [...]}`` (batchGet)."""
    obj = _as_map(decode_body(body, fmt), "the body")
    _fields(obj, required={"keys"}, allowed={"keys"}, what="the body")
    return KeysBody(list(_keys(obj)))


def parse_delete(body: bytes, fmt: BodyFormat) -> DeleteBody:
    """Parses ``{"keys": [...], "wait"?: false}`` (batchDelete)."""
    obj = _as_map(decode_body(body, fmt), "the body")
    _fields(obj, required={"keys"}, allowed={"keys", "wait"}, what="the body")
    return DeleteBody(list(_keys(obj)), _bool(obj.get("wait", False), "wait"))


def parse_sample(body: bytes, fmt: BodyFormat) -> SampleBody:
    """Parses ``{"batch_size", "timeout_ms"?, "include_values"?}``."""
    obj = _as_map(decode_body(body, fmt), "the body")
    _fields(
        obj,
        required={"batch_size"},
        allowed={"batch_size", "timeout_ms", "include_values"},
        what="the body",
    )
    return SampleBody(
        batch_size=_int(obj["batch_size"], "batch_size", low=1, high=MAX_BATCH_SIZE),
        timeout_ms=_int(
            obj.get("timeout_ms", DEFAULT_TIMEOUT_MS), "timeout_ms", low=0, high=MAX_TIMEOUT_MS
        ),
        include_values=_bool(obj.get("include_values", True), "include_values"),
    )


def parse_priorities(body: bytes, fmt: BodyFormat) -> PrioritiesBody:
    """Parses ``{"priorities": {key: priority, ...}}``."""
    obj = _as_map(decode_body(body, fmt), "the body")
    _fields(obj, required={"priorities"}, allowed={"priorities"}, what="the body")
    given = _as_map(obj["priorities"], "priorities")
    return PrioritiesBody(
        {
            check_key(key, "a key of priorities"): check_priority(value, f"priorities[{key!r}]")
            for key, value in given.items()
        }
    )


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
    obj = _as_map(decode_body(body, fmt), "the body")
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
