"""Columnar push bodies: ``{"keys", "columns": {field: array}, "priorities"?, "wait"?}``.

The second form of ``POST /v1/tables/{table}/items``
(:class:`~rlreplay.wire.schemas.ColumnsPushRequest`). A body that the per-item form refuses
and that names ``columns`` or ``keys`` (and not ``items``) is read as this form; any other
body keeps the per-item form's answer. Item ``i`` gets the value ``{field:
columns[field][i], ...}``, built by :func:`~rlreplay.app.tables.unstacking.unstack_values`
as the bytes the per-item form would have stored.

In msgpack, a column is extension type 1 and its data is read where it lies in the body; in
JSON, the contract's ``{"$ndarray": ...}`` form. Refusals follow the per-item form's split:
a body that is not a map, or a field of the wrong type (a column that is not an array) is
400; a column whose first axis is not ``len(keys)``, a field name that is not a string or
appears twice, a bad key or priority is 422, the message naming the field.

The log keeps a msgpack columnar push as a ``push_columns`` record: its keys, priorities and
``columns`` map as sent, from which replay builds the same values again (see
:meth:`rlreplay.app.engine.engine.Engine.push`); a JSON one as the ``put`` record of the
values built here.
"""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec
import numpy as np

from rlreplay.app.api.bodies import (
    PushBody,
    check_finite,
    check_keys,
    parse_push,
    schema_refusal,
)
from rlreplay.app.api.encoding import BodyFormat
from rlreplay.app.tables.items import NewItem
from rlreplay.app.tables.tag_index import check_tags
from rlreplay.app.tables.unstacking import (
    ColumnIn,
    checked_column,
    msgpack_columns,
    unstack_values,
)
from rlreplay.wire.arrays import BFloat16Array, wire_dtype
from rlreplay.wire.codec import from_jsonable, unpackb
from rlreplay.wire.errors import BadRequest, ValidationFailed
from rlreplay.wire.headers import map_size
from rlreplay.wire.schemas import DEFAULT_PRIORITY, ColumnsPushRequest

__all__ = ["parse_any_push", "parse_columns_push"]

_Decoder = msgspec.msgpack.Decoder[Any] | msgspec.json.Decoder[Any]
_TOP: Final[dict[BodyFormat, _Decoder]] = {
    BodyFormat.MSGPACK: msgspec.msgpack.Decoder(dict[str, msgspec.Raw]),
    BodyFormat.JSON: msgspec.json.Decoder(dict[str, msgspec.Raw]),
}
_BODY: Final[dict[BodyFormat, _Decoder]] = {
    BodyFormat.MSGPACK: msgspec.msgpack.Decoder(ColumnsPushRequest),
    BodyFormat.JSON: msgspec.json.Decoder(ColumnsPushRequest),
}
_UNREADABLE = (msgspec.DecodeError, ValueError, RecursionError)
_COLUMNS_FIRST: Final = (b"\xa4keys", b"\xa7columns")  # the names as msgpack fixstr
_NULL: Final = msgspec.Raw(b"null")


def parse_any_push(body: bytes | memoryview, fmt: BodyFormat) -> PushBody:
    """Parses a push body of either form (see the module docstring).

    Raises:
        BadRequest: Malformed, or a field of the wrong type.
        ValidationFailed: A missing, unknown or repeated field, a bad key, priority or
            column.
    """
    if fmt is BodyFormat.MSGPACK and _columns_first(body):  # no per-item attempt to fail
        top = _top_fields(body, fmt)
        if top is not None and "items" not in top:
            return parse_columns_push(body, fmt, top)
    try:
        return parse_push(body, fmt)
    except BadRequest:
        raise
    except ValidationFailed:
        # the per-item parser stops at the first unknown field ("keys"), before it reads
        # the rest: a malformed body answers 400 here, not that 422
        top = _top_fields(body, fmt)
        if top is None or "items" in top or not ({"columns", "keys"} & top.keys()):
            raise
    return parse_columns_push(body, fmt, top)


def _columns_first(body: bytes | memoryview) -> bool:
    """Whether ``body`` is a small msgpack map whose first field is ``keys`` or ``columns``
    (as the clients write the columnar form): the per-item form cannot have it."""
    return len(body) > 8 and 0x80 <= body[0] <= 0x8F and bytes(body[1:9]).startswith(_COLUMNS_FIRST)


def _top_fields(body: bytes | memoryview, fmt: BodyFormat) -> dict[str, msgspec.Raw] | None:
    """The body's fields, unread; None when it is not a map of names.

    Raises:
        BadRequest: The body is not well-formed JSON or msgpack.
    """
    try:
        top: dict[str, msgspec.Raw] = _TOP[fmt].decode(body)
    except msgspec.ValidationError:
        return None
    except _UNREADABLE as exc:
        if fmt is BodyFormat.JSON:  # JSON that only Python's parser reads, as the per-item form
            try:
                obj = json.loads(bytes(body))
            except (ValueError, RecursionError):
                pass
            else:
                return dict.fromkeys(obj, _NULL) if isinstance(obj, dict) else None
        raise BadRequest(f"malformed {fmt.value} push body: {exc}") from exc
    return top


def parse_columns_push(
    body: bytes | memoryview, fmt: BodyFormat, top: dict[str, msgspec.Raw] | None = None
) -> PushBody:
    """Parses a columnar push body into the items it stands for.

    Args:
        body: The raw request body.
        fmt: Its format.
        top: Its fields, when already read.

    Returns:
        The items, in the order of ``keys``, and whether to wait for the writer.

    Raises:
        BadRequest: Malformed, or a field of the wrong type.
        ValidationFailed: As the module docstring says.
    """
    if not body:
        raise BadRequest("the request body is empty")
    try:
        request: ColumnsPushRequest = _BODY[fmt].decode(body)
    except msgspec.ValidationError as exc:
        raise schema_refusal(exc) from None
    except _UNREADABLE as exc:
        raise BadRequest(f"malformed {fmt.value} push body: {exc}") from exc
    if fmt is BodyFormat.MSGPACK:
        top = top if top is not None else _top_fields(body, fmt)
        if top is not None and map_size(body) != len(top):
            raise ValidationFailed("duplicate field(s) in the body")
    keys = request.keys
    check_keys(keys, lambda i: f"keys[{i}]")
    n = len(keys)
    if fmt is BodyFormat.MSGPACK:
        columns = msgpack_columns(request.columns, n)
    else:
        columns = _json_columns(request.columns, n)
    if not columns:
        raise ValidationFailed("columns must name at least one field")
    priorities = _priorities(request.priorities, fmt, n)
    values = unstack_values(columns, n)
    rid = None if request.request_id is msgspec.UNSET else request.request_id
    raw = memoryview(request.columns) if fmt is BodyFormat.MSGPACK else None
    tags, groups, versions = _per_key(request.tags, "tags", n), None, None
    if tags is not None:
        tags = [
            None if tg is None else check_tags(tg, f"tags[{i}]") or None
            for i, tg in enumerate(tags)
        ]
    groups = _per_key(request.groups, "groups", n)
    versions = _per_key(request.versions, "versions", n)
    if tags is None and groups is None and versions is None:
        items = list(map(NewItem, keys, values, priorities))
    else:
        nones: list[Any] = [None] * n
        items = list(
            map(
                NewItem, keys, values, priorities, groups or nones, versions or nones, tags or nones
            )
        )
    reservation = None if request.reservation is msgspec.UNSET else request.reservation
    return PushBody(items, request.wait, None, rid, raw, reservation)


def _per_key(given: list[Any] | msgspec.UnsetType, name: str, n: int) -> list[Any] | None:
    """A per-key list of a columnar push (None when not given).

    Raises:
        ValidationFailed: Its length is not the number of keys.
    """
    if isinstance(given, msgspec.UnsetType):
        return None
    if len(given) != n:
        raise ValidationFailed(f"{name} has {len(given)} entries, but there are {n} keys")
    return given


class _Pairs(list[tuple[Any, Any]]):
    """A JSON object's members in order, duplicates kept."""


def _maps(obj: Any) -> Any:
    if isinstance(obj, _Pairs):
        return {key: _maps(value) for key, value in obj}
    if isinstance(obj, list):
        return [_maps(item) for item in obj]
    return obj


def _json_columns(raw: msgspec.Raw, n: int) -> list[ColumnIn]:
    try:
        members = json.loads(bytes(raw), object_pairs_hook=_Pairs)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"malformed json columns: {exc}") from exc
    if not isinstance(members, _Pairs):
        raise BadRequest("columns must be a map of field name to array")
    if len({name for name, _ in members}) != len(members):
        raise ValidationFailed("columns: a field is named twice")
    columns = []
    for name, form in members:
        try:
            array = from_jsonable(_maps(form))
        except ValueError as exc:
            raise BadRequest(f"columns[{name!r}]: {exc}") from None
        if isinstance(array, BFloat16Array):
            dtype, array = "bfloat16", array.bits.astype("<u2", copy=False)
        elif isinstance(array, np.ndarray):
            dtype = wire_dtype(array.dtype)
        else:
            raise BadRequest(f'columns[{name!r}] must be an array ({{"$ndarray": ...}})')
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
        columns.append(checked_column(name, dtype, array.shape, data, n))
    return columns


def _priorities(raw: msgspec.Raw | msgspec.UnsetType, fmt: BodyFormat, n: int) -> list[float]:
    if isinstance(raw, msgspec.UnsetType):
        return [DEFAULT_PRIORITY] * n
    try:
        if fmt is BodyFormat.MSGPACK:
            given = unpackb(raw)
        else:
            given = from_jsonable(json.loads(bytes(raw)))
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"priorities: {exc}") from None
    if isinstance(given, np.ndarray) and given.ndim == 1 and given.dtype.kind in "biuf":
        given = given.astype(np.float64).tolist()
    if not isinstance(given, list):
        raise BadRequest("priorities must be a list of numbers or a 1-D array")
    if len(given) != n:
        raise ValidationFailed(f"priorities has {len(given)} entries, but there are {n} keys")
    priorities = []
    for i, p in enumerate(given):
        if type(p) not in (int, float):
            raise BadRequest(f"priorities[{i}] must be a number")
        if not p >= 0:  # NaN too
            raise ValidationFailed(f"priorities[{i}] must be a finite number >= 0, not {p}")
        try:
            priorities.append(float(p))
        except OverflowError:  # a JSON integer past a float's range
            raise ValidationFailed(f"priorities[{i}] is out of a float's range") from None
    check_finite(priorities, lambda i: f"priorities[{i}]")
    return priorities
