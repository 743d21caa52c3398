"""The request bodies the client sends: the wire schemas' Structs, encoded as msgpack.

The client builds each body as its Struct of :mod:`rlreplay.wire.schemas`, the definition
the server decodes it with, and msgspec encodes it. Item values are packed by the codec
(:func:`rlreplay.wire.codec.packb`: arrays, tensors, NumPy scalars...) and spliced into the
body as :class:`msgspec.Raw`, so they travel exactly as the codec packs them; whatever else
msgspec cannot encode in a body's fields (a NumPy scalar as a priority) goes through the
codec too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from rlreplay.wire.codec import packb
from rlreplay.wire.errors import ValidationFailed
from rlreplay.wire.schemas import DEFAULT_PRIORITY, ItemIn, PushRequest

__all__ = ["encode_body", "push_request"]


def _pack_raw(obj: Any) -> msgspec.Raw:
    """What msgspec does not encode itself, packed by the codec and spliced in."""
    return msgspec.Raw(packb(obj))


_ENCODER: Final = msgspec.msgpack.Encoder(enc_hook=_pack_raw)
#: Splits the values of a push, packed together, into each one's msgpack bytes.
_VALUE_SPANS: Final = msgspec.msgpack.Decoder(list[msgspec.Raw])
_ITEM_FIELDS: Final = frozenset(ItemIn.__struct_fields__)


def encode_body(body: Any) -> bytes:
    """A request body as msgpack: a wire Struct, or plain data (a table's config).

    Raises:
        TypeError: A field holds what the codec cannot encode.
        ValueError: An int does not fit in 64 bits (as the codec says it).
    """
    if not isinstance(body, msgspec.Struct):
        return packb(body)
    try:
        return _ENCODER.encode(body)
    except OverflowError as exc:
        raise ValueError(f"cannot encode: {exc}") from exc


def push_request(items: Sequence[Mapping[str, Any]], wait: bool) -> PushRequest:
    """A push body, each value packed by the codec and spliced in as is.

    The values are packed in one call, as one list, then cut into their spans: packing each
    on its own costs the codec a packer per value.

    Args:
        items: ``{"key", "value", "priority"?}`` each.
        wait: Whether the server answers once the writer applied the items.

    Returns:
        The body.

    Raises:
        ValidationFailed: An item misses ``key`` or ``value`` or has another field: the
            server's 422, said before sending.
    """
    try:
        packed = packb([item["value"] for item in items])
        body_items = [
            ItemIn(item["key"], value, item.get("priority", DEFAULT_PRIORITY))
            for item, value in zip(items, _VALUE_SPANS.decode(packed), strict=True)
            # with key and value there, no field but priority (the cheapest test)
            if len(item) - ("priority" in item) == 2
        ]
    except KeyError:
        raise _item_error(items) from None
    if len(body_items) != len(items):
        raise _item_error(items)
    return PushRequest(body_items, wait)


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
