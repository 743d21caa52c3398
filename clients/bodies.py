"""The request bodies the client sends: the wire schemas' Structs, encoded as msgpack.

The client builds each body as its Struct of :mod:`rlreplay.wire.schemas`, the definition
the server decodes it with, and msgspec encodes it. Item values are packed by the codec
(:func:`rlreplay.wire.codec.packb`: arrays, tensors, NumPy scalars...) and spliced into the
body as :class:`msgspec.Raw`, so they travel exactly as the codec packs them; whatever else
msgspec cannot encode in a body's fields (a NumPy scalar as a priority) goes through the
codec too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypedDict

import msgspec
import numpy as np

from rlreplay.clients.body_pieces import Packed, body_pieces, joined, stand_in
from rlreplay.clients.columns import flat_columns
from rlreplay.wire.arrays import BFloat16Array, torch_tensor_type
from rlreplay.wire.codec import packb
from rlreplay.wire.errors import ValidationFailed
from rlreplay.wire.packing import array_ext, is_plain, pack_pieces
from rlreplay.wire.pieces import LARGE_PIECE_BYTES, Pieces
from rlreplay.wire.schemas import DEFAULT_PRIORITY, ColumnsPushRequest, ItemIn, PushRequest

__all__ = ["ColumnsMeta", "columns_request", "encode_body", "packed_item", "push_request"]


def _pack_raw(obj: Any) -> msgspec.Raw:
    """What msgspec does not encode itself: an array as its extension, anything else packed
    by the codec and spliced in."""
    if type(obj) is np.ndarray:
        return array_ext(obj)
    if type(obj) is Packed:
        return joined(obj)
    return msgspec.Raw(packb(obj))


_ENCODER: Final = msgspec.msgpack.Encoder(enc_hook=_pack_raw)
#: Splits the values of a push, packed together, into each one's msgpack bytes.
_VALUE_SPANS: Final = msgspec.msgpack.Decoder(list[msgspec.Raw])
_ITEM_FIELDS: Final = frozenset(ItemIn.__struct_fields__)


def encode_body(body: Any) -> bytes | Pieces:
    """A request body as msgpack: a wire Struct, or plain data (a table's config); a push
    of large arrays as the :class:`~rlreplay.wire.pieces.Pieces` of its bytes, the arrays'
    data where it lies (:mod:`rlreplay.clients.body_pieces`).

    Raises:
        TypeError: A field holds what the codec cannot encode.
        ValueError: An int does not fit in 64 bits (as the codec says it).
    """
    if not isinstance(body, msgspec.Struct):
        return packb(body)
    try:
        pieces = body_pieces(body, _ENCODER)
        return _ENCODER.encode(body) if pieces is None else pieces
    except OverflowError as exc:
        raise ValueError(f"cannot encode: {exc}") from exc


def push_request(
    items: Sequence[Mapping[str, Any]], wait: bool, reservation: str | None = None
) -> PushRequest:
    """A push body, each value packed by the codec and spliced in as is.

    Plain values (maps of strings to arrays, plain scalars and more such maps and lists: the
    usual kind) stay as they are: msgspec encodes them with the body, in one pass. Others
    (tensors, NumPy scalars, maps with other keys...) are packed in
    one call, as one list, then cut into their spans: packing each on its own costs the
    codec a packer per value.

    Args:
        items: ``{"key", "value", "priority"?, "group"?, "version"?, "tags"?}`` each.
        wait: Whether the server answers once the writer applied the items.
        reservation: The reservation whose slots the items fill.

    Returns:
        The body.

    Raises:
        ValidationFailed: An item misses ``key`` or ``value`` or has another field: the
            server's 422, said before sending.
    """
    try:
        values: list[Any] = [item["value"] for item in items]
        if _carries_large_arrays(values[0] if values else None):
            values = [stand_in(pack_pieces(value)) for value in values]  # sent as they lie
        elif not is_plain(values):
            values = _VALUE_SPANS.decode(packb(values))
        body_items = [
            ItemIn(item["key"], value, item.get("priority", DEFAULT_PRIORITY))
            if len(item) - ("priority" in item) == 2  # key and value (the common case)
            else ItemIn(
                item["key"],
                value,
                item.get("priority", DEFAULT_PRIORITY),
                item.get("group", msgspec.UNSET),
                item.get("version", msgspec.UNSET),
                item.get("tags", msgspec.UNSET),
            )
            for item, value in zip(items, values, strict=True)
            # with key and value there, no field but priority, group, version and tags
            if len(item) - sum(name in item for name in _OPTIONAL) == 2
        ]
    except KeyError:
        raise _item_error(items) from None
    if len(body_items) != len(items):
        raise _item_error(items)
    request = PushRequest(body_items, wait)
    if reservation is not None:
        request.reservation = reservation
    return request


#: Pushes of large arrays go as pieces (off: joined into one body first; ``python -m
#: bench.bulk --arms`` compares the two).
SEND_IN_PIECES = True


def _carries_large_arrays(value: Any) -> bool:
    """Whether a push's first value is (or maps a name to) a NumPy array of
    :data:`~rlreplay.wire.pieces.LARGE_PIECE_BYTES` or more: the push's values then go as
    pieces (the others in a push are alike, nearly always)."""
    if not SEND_IN_PIECES:
        return False
    if type(value) is dict:
        return any(type(v) is np.ndarray and v.nbytes >= LARGE_PIECE_BYTES for v in value.values())
    return type(value) is np.ndarray and value.nbytes >= LARGE_PIECE_BYTES


#: The fields an item may have beside its key and value.
_OPTIONAL = ("priority", "group", "version", "tags")


def _item_error(items: Sequence[Mapping[str, Any]]) -> ValidationFailed:
    """The server's 422 for the first item with a field missing or unknown."""
    for i, item in enumerate(items):
        missing = sorted({"key", "value"} - item.keys())
        unknown = sorted(str(name) for name in item.keys() - _ITEM_FIELDS)
        if missing:
            return ValidationFailed(f"missing field(s) in items[{i}]: {', '.join(missing)}")
        if unknown:
            return ValidationFailed(f"unknown field(s) in items[{i}]: {', '.join(unknown)}")
    raise AssertionError("every item has its fields")  # pragma: no cover


def packed_item(key: str, value: Any, priority: float = DEFAULT_PRIORITY) -> ItemIn:
    """One item of a push body, its value packed now (later changes to it do not travel).

    Raises:
        TypeError: The value has no wire form.
        ValueError: An int in it does not fit in 64 bits.
    """
    return ItemIn(key, msgspec.Raw(packb(value)), priority)


def _column(values: Any) -> Any:
    """An array as the codec sends it: NumPy arrays, tensors, :class:`BFloat16Array` as
    they are; anything else (lists) through ``np.asarray``."""
    if isinstance(values, np.ndarray | BFloat16Array):
        return values
    tensor_type = torch_tensor_type()
    if tensor_type is not None and isinstance(values, tensor_type):
        return values
    return np.asarray(values)


def columns_request(
    keys: Iterable[str],
    columns: Mapping[str, Any],
    priorities: Any,
    wait: bool,
    meta: ColumnsMeta | None = None,
) -> ColumnsPushRequest:
    """A columnar push body: item ``i`` is ``keys[i]`` with ``{field: columns[field][i]}``.

    Args:
        keys: The items' keys.
        columns: Field -> array (NumPy, torch, :class:`BFloat16Array`, or a list) whose first
            axis is ``len(keys)``; packed in one go, each as one array.
        priorities: One per key (a sequence or a 1-D array), or None for 1.0 each.
        wait: Whether the server answers once the writer applied the items.
        meta: Per-key ``tags``, ``groups``, ``versions`` and the ``reservation`` filled.

    Raises:
        TypeError: A column has no wire form.
    """
    columns = flat_columns(columns)  # a TensorDict, flattened
    named = {name: _column(values) for name, values in columns.items()}
    packed = stand_in(pack_pieces(named)) if SEND_IN_PIECES else msgspec.Raw(packb(named))
    given: Any = msgspec.UNSET
    if priorities is not None:
        given = msgspec.Raw(packb(np.ascontiguousarray(priorities, dtype=np.float64)))
    body = ColumnsPushRequest(list(keys), packed, given, wait)
    meta = meta or {}
    if (tags := meta.get("tags")) is not None:
        body.tags = [None if tg is None else dict(tg) for tg in tags]
    if (groups := meta.get("groups")) is not None:
        body.groups = list(groups)
    if (versions := meta.get("versions")) is not None:
        body.versions = [None if v is None else int(v) for v in versions]
    if (reservation := meta.get("reservation")) is not None:
        body.reservation = reservation
    return body


class ColumnsMeta(TypedDict, total=False):
    """What a columnar push may carry beside its columns: one entry per key in ``tags``,
    ``groups`` and ``versions`` (None where an item has none), and the reservation whose
    slots the items fill."""

    tags: Sequence[Mapping[str, Any] | None] | None
    groups: Sequence[str | None] | None
    versions: Sequence[int | None] | None
    reservation: str | None
