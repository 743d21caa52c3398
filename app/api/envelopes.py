"""Answers that carry items: msgpack written by hand around the stored values, or JSON.

In msgpack the envelope (maps, keys, priorities...) is packed here and each item's stored
value, already msgpack, is spliced in as is: a value is never decoded nor re-encoded on its
way out. Floats are packed as float64 and ``times_sampled`` as uint64, both valid msgpack.

In JSON each value is converted to the contract's JSON form with
:func:`rlreplay.wire.codec.msgpack_to_jsonable`. A stored value that has no JSON form (an unknown
extension type, a string that is not UTF-8) is answered as ``{"$msgpack": "<base64>"}``,
its raw bytes, rather than failing the request. NaN and infinities stay floats here;
:func:`rlreplay.app.api.encoding.dump_json` spells them ``{"$float": ...}`` when it meets one.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Any

import msgpack
import msgspec
import numpy as np

from rlreplay.app.tables.items import Item, SampleBatch
from rlreplay.wire.codec import msgpack_to_jsonable
from rlreplay.wire.headers import array_header, str_bytes, str_header
from rlreplay.wire.schemas import MAX_KEY_BYTES

__all__ = [
    "item_json",
    "item_msgpack",
    "items_json",
    "items_msgpack",
    "sample_json",
    "sample_msgpack",
    "value_json",
]

_ITEMS_MAP = b"\x81\xa5items"  # {"items": ...
_NIL = b"\xc0"
_ITEM_HEAD = b"\x85\xa3key"  # 5-entry map, then "key"
_SAMPLED_HEAD = b"\x86\xa3key"  # 6-entry map, then "key"
_VALUE = b"\xa5value"


def _names(*fields: tuple[str, str]) -> tuple[bytes, ...]:
    """Each field's name as a fixstr, then the marker of its number: msgpack float64 (0xcb)
    for ``"d"``, uint64 (0xcf) for ``"Q"``."""
    return tuple(
        msgpack.packb(name) + (b"\xcb" if code == "d" else b"\xcf") for name, code in fields
    )


def _tail(*fields: tuple[str, str]) -> tuple[struct.Struct, tuple[bytes, ...]]:
    """A struct packing ``name, number`` pairs, and the names (see :func:`_names`)."""
    names = _names(*fields)
    fmt = ">" + "".join(f"{len(n)}s{code}" for n, (_, code) in zip(names, fields, strict=True))
    return struct.Struct(fmt), names


#: priority, inserted_at, times_sampled of an Item, names included.
_ITEM_TAIL, _ITEM_NAMES = _tail(("priority", "d"), ("inserted_at", "d"), ("times_sampled", "Q"))
#: The names of a SampledItem's priority, probability, weight, times_sampled, each with its
#: number's marker (numpy packs the numbers: see ``_SAMPLED_ROW``).
_SAMPLED_NAMES = _names(
    ("priority", "d"), ("probability", "d"), ("weight", "d"), ("times_sampled", "Q")
)


def _item_parts(item: Item, out: list[bytes]) -> None:
    p, i, t = _ITEM_NAMES
    extra = _rollout_parts(item.group, item.version, item.tags)
    out += (
        _ITEM_HEAD if not extra else bytes((0x85 + len(extra) // 2,)) + b"\xa3key",
        str_bytes(item.key),
        _VALUE,
        item.value,
        _ITEM_TAIL.pack(p, item.priority, i, item.inserted_at, t, item.times_sampled),
        *extra,
    )


_GROUP = b"\xa5group"
_VERSION = b"\xa7version"


_TAGS = b"\xa4tags"
_PACK_TAGS = msgspec.msgpack.Encoder().encode


def _rollout_parts(
    group: str | None, version: int | None, tags: dict[str, Any] | None = None
) -> list[bytes]:
    """``"group"``, ``"version"`` and ``"tags"`` entries of an item's map, those it has."""
    out: list[bytes] = []
    if group is not None:
        out += (_GROUP, str_bytes(group))
    if version is not None:
        out += (_VERSION, b"\xcf" + version.to_bytes(8, "big"))
    if tags:
        out += (_TAGS, _PACK_TAGS(tags))
    return out


def item_msgpack(item: Item) -> bytes:
    """``{"key", "value", "priority", "inserted_at", "times_sampled"}`` with the raw value."""
    out: list[bytes] = []
    _item_parts(item, out)
    return b"".join(out)


def items_msgpack(items: Sequence[Item | None]) -> bytes:
    """``{"items": [item or nil, ...]}`` in the order given."""
    out = [_ITEMS_MAP, array_header(len(items))]
    for item in items:
        if item is None:
            out.append(_NIL)
        else:
            _item_parts(item, out)
    return b"".join(out)


#: The fixed tail of a sampled item, one row per pick, filled by numpy for a whole batch.
_SAMPLED_ROW = np.dtype(
    [
        field
        for i, (name, code) in enumerate(zip(_SAMPLED_NAMES, "dddQ", strict=True))
        for field in ((f"n{i}", f"S{len(name)}"), (f"v{i}", ">f8" if code == "d" else ">u8"))
    ]
)
#: Each tail as one opaque record: ``tolist()`` of an array of them gives one bytes per pick.
_SAMPLED_TAIL_RECORD = np.dtype(f"V{_SAMPLED_ROW.itemsize}")
#: ``_SAMPLED_HEAD`` + the str header of a key of ``n`` bytes, by ``n`` (every size allowed).
_SAMPLED_HEADS = [_SAMPLED_HEAD + str_header(n) for n in range(MAX_KEY_BYTES + 1)]


def _sampled_tails(batch: SampleBatch) -> list[bytes]:
    """Each pick's ``priority, probability, weight, times_sampled`` entries, names included."""
    rows = np.empty(len(batch), dtype=_SAMPLED_ROW)
    for i, name in enumerate(_SAMPLED_NAMES):
        rows[f"n{i}"] = name
    rows["v0"] = batch.priorities
    rows["v1"] = batch.probabilities
    rows["v2"] = batch.weights
    rows["v3"] = batch.times_sampled
    tails: list[bytes] = rows.view(_SAMPLED_TAIL_RECORD).tolist()
    return tails


def _or_nil(values: list[bytes | None]) -> list[bytes]:
    """The stored values, msgpack's nil where a value was not asked for."""
    if None not in values:
        return values  # type: ignore[return-value]  # None is not in it
    return [_NIL if value is None else value for value in values]


def sample_msgpack(batch: SampleBatch) -> bytes:
    """``{"items": [{"key", "value", "priority", "probability", "weight", "times_sampled"}]}``.

    The numeric tails of all picks are packed by numpy at once, and the answer's pieces are
    put in place by slice assignments, with no Python step per pick. The stored values are
    spliced in as they are; ``value`` is nil when asked without values.
    """
    n = len(batch)
    tails = _sampled_tails(batch)
    values = _or_nil(batch.values)
    if batch.groups is not None and batch.versions is not None:
        out: list[bytes] = [_ITEMS_MAP, array_header(n)]
        tags = batch.tags or [None] * n
        for key, value, tail, group, version, tg in zip(
            batch.keys, values, tails, batch.groups, batch.versions, tags, strict=True
        ):
            extra = _rollout_parts(group, version, tg)
            out += (bytes((0x86 + len(extra) // 2,)), b"\xa3key", str_bytes(key), _VALUE)
            out += (value, tail, *extra)
        return b"".join(out)
    encoded = list(map(str.encode, batch.keys))
    out = [_ITEMS_MAP + array_header(n)] * (5 * n + 1)  # the first stays; the rest are set
    out[1::5] = map(_SAMPLED_HEADS.__getitem__, map(len, encoded))
    out[2::5] = encoded
    out[3::5] = [_VALUE] * n
    out[4::5] = values
    out[5::5] = tails
    return b"".join(out)


def value_json(value: bytes | None) -> Any:
    """The JSON form of a stored value (``{"$msgpack": base64}`` when it has none)."""
    if value is None:
        return None
    try:
        return msgpack_to_jsonable(value)
    except (ValueError, TypeError, RecursionError):
        return {"$msgpack": base64.b64encode(value).decode("ascii")}


def item_json(item: Item) -> dict[str, Any]:
    """An item as a JSON-able dict."""
    out = {
        "key": item.key,
        "value": value_json(item.value),
        "priority": item.priority,
        "inserted_at": item.inserted_at,
        "times_sampled": item.times_sampled,
    }
    if item.group is not None:
        out["group"] = item.group
    if item.version is not None:
        out["version"] = item.version
    if item.tags:
        out["tags"] = item.tags
    return out


def items_json(items: Sequence[Item | None]) -> dict[str, Any]:
    """``{"items": [item or null, ...]}`` as a JSON-able dict."""
    return {"items": [None if item is None else item_json(item) for item in items]}


def sample_json(batch: SampleBatch) -> dict[str, Any]:
    """A sample's answer as a JSON-able dict."""
    items = batch.items()
    out = []
    for s in items:
        pick = {
            "key": s.key,
            "value": value_json(s.value),
            "priority": s.priority,
            "probability": s.probability,
            "weight": s.weight,
            "times_sampled": s.times_sampled,
        }
        if s.group is not None:
            pick["group"] = s.group
        if s.version is not None:
            pick["version"] = s.version
        if s.tags:
            pick["tags"] = s.tags
        out.append(pick)
    return {"items": out}
