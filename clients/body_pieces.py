"""Push bodies sent as the pieces of their bytes: arrays' data where it lies, never joined.

A push of large arrays (``push_columns`` of MiBs, ``push`` of items of 64 KiB and more) is
a few hundred bytes of msgpack around data that already lies in the caller's arrays.
:func:`~rlreplay.clients.bodies.columns_request` and
:func:`~rlreplay.clients.bodies.push_request` pack those arrays' values as
:class:`~rlreplay.wire.pieces.Pieces` (:func:`~rlreplay.wire.packing.pack_pieces`) and
leave them in the body's Struct, each behind a :class:`Packed` placeholder. Encoding the
body (:func:`body_pieces`) writes the Struct with every placeholder empty and cuts the
result where each one stood, which msgspec's order of a Struct's fields fixes: after the
map's header, the field's name and the fields before it. The bytes are those of the body
joined (``tests/clients/test_bodies.py`` checks it); the transport writes the pieces in
order (:func:`rlreplay.clients.exchange.write_request`).

Any other encoder meeting a placeholder (through the codec's hook, :func:`joined`) gets its
pieces joined.
"""

from __future__ import annotations

from typing import Any, Final, cast

import msgspec

from rlreplay.wire.headers import array_header
from rlreplay.wire.pieces import Pieces
from rlreplay.wire.schemas import ColumnsPushRequest, PushRequest

__all__ = ["Packed", "body_pieces", "joined", "stand_in"]


class Packed:
    """A value (or a ``columns`` map) packed as pieces, standing in its Struct field until
    the body is encoded."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: Pieces) -> None:
        self.pieces = pieces


def stand_in(pieces: Pieces) -> msgspec.Raw:
    """``pieces`` behind a placeholder typed as the ``Raw`` field it stands in."""
    return cast(msgspec.Raw, Packed(pieces))


def joined(packed: Packed) -> msgspec.Raw:
    """The placeholder's bytes, joined (for an encoder other than :func:`body_pieces`)."""
    return msgspec.Raw(bytes(packed.pieces))


_EMPTY: Final = msgspec.Raw(b"")
_KEYS: Final = b"\xa4keys"
_COLUMNS: Final = b"\xa7columns"
_ITEMS: Final = b"\xa5items"
_KEY: Final = b"\xa3key"
_VALUE: Final = b"\xa5value"


def body_pieces(body: Any, encoder: msgspec.msgpack.Encoder) -> Pieces | None:
    """A push body whose placeholders :func:`stand_in` for pieces, as the
    :class:`~rlreplay.wire.pieces.Pieces` of its bytes; None for any other body.

    Raises:
        OverflowError: As ``encoder.encode``.
    """
    if type(body) is ColumnsPushRequest:
        columns: Any = body.columns
        if type(columns) is Packed:
            return _columns(body, columns, encoder)
    elif type(body) is PushRequest and body.items:
        first: Any = body.items[0].value
        if type(first) is Packed:
            return _items(body, encoder)
    return None


def _columns(body: ColumnsPushRequest, columns: Packed, encoder: msgspec.msgpack.Encoder) -> Pieces:
    body.columns = _EMPTY
    try:
        around = encoder.encode(body)
    finally:
        body.columns = cast(msgspec.Raw, columns)
    at = 1 + len(_KEYS) + len(encoder.encode(body.keys)) + len(_COLUMNS)
    if around[1 : 1 + len(_KEYS)] != _KEYS or around[at - len(_COLUMNS) : at] != _COLUMNS:
        raise AssertionError("a columnar body's fields out of order")  # pragma: no cover
    return Pieces([around[:at], *columns.pieces.parts, around[at:]])


def _items(body: PushRequest, encoder: msgspec.msgpack.Encoder) -> Pieces:
    items = body.items
    body.items = []
    try:
        around = encoder.encode(body)  # {"items": [], ...}
    finally:
        body.items = items
    at = 1 + len(_ITEMS)
    if around[1:at] != _ITEMS or around[at] != 0x90:
        raise AssertionError("a push body's fields out of order")  # pragma: no cover
    parts: list[Any] = [around[:at], array_header(len(items))]
    for item in items:
        value: Any = item.value
        item.value = _EMPTY
        try:
            encoded = encoder.encode(item)  # {"key", "value": (nothing), "priority"...}
        finally:
            item.value = value
        cut = 1 + len(_KEY) + len(encoder.encode(item.key)) + len(_VALUE)
        if encoded[cut - len(_VALUE) : cut] != _VALUE:
            raise AssertionError("an item's fields out of order")  # pragma: no cover
        pieces = value.pieces.parts if type(value) is Packed else [bytes(value)]
        parts += [encoded[:cut], *pieces, encoded[cut:]]
    parts.append(around[at + 1 :])
    return Pieces(parts)
