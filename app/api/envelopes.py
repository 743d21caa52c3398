"""Answers that carry items: msgpack written by hand around the stored values, or JSON.

In msgpack the envelope (maps, keys, priorities...) is packed here and each item's stored
value, already msgpack, is spliced in as is: a value is never decoded nor re-encoded on its
way out. Floats are packed as float64 and ``times_sampled`` as uint64, both valid msgpack.

An answer holding a value of :data:`LARGE_PIECE_BYTES` or more is not joined: it goes to the
socket as pieces (:class:`~rlreplay.app.api.gathered_writes.AnswerPieces`), each large value
the stored ``bytes`` where it lies and everything between two of them joined, so the kernel
copies each value once, into the socket. Each item's head then takes the msgpack forms (a
longer map header, longer headers of ``"key"`` and ``"value"``, which every decoder reads
the same) that put the data of its value's first array at a multiple of 8 of the answer, so a
client that reads the answer into an aligned buffer can use that array in place.

In JSON each value is converted to the contract's JSON form with
:func:`rlreplay.wire.codec.msgpack_to_jsonable`. A stored value that has no JSON form (an unknown
extension type, a string that is not UTF-8) is answered as ``{"$msgpack": "<base64>"}``,
its raw bytes, rather than failing the request. NaN and infinities stay floats here;
:func:`rlreplay.app.api.encoding.dump_json` spells them ``{"$float": ...}`` when it meets one.
"""

from __future__ import annotations

import base64
import functools
import itertools
import struct
from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgpack
import msgspec
import numpy as np

from rlreplay.app.api.gathered_writes import AnswerPieces
from rlreplay.app.tables.items import Item, ItemBatch, SampleBatch
from rlreplay.wire.arrays import EXT_NDARRAY
from rlreplay.wire.codec import msgpack_to_jsonable
from rlreplay.wire.headers import array_header, read_ext_header, str_bytes, str_header
from rlreplay.wire.pieces import LARGE_PIECE_BYTES
from rlreplay.wire.schemas import MAX_KEY_BYTES

__all__ = [
    "SEND_AS_THEY_LIE",
    "item_batch_msgpack",
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


def items_msgpack(items: Sequence[Item | None]) -> bytes | AnswerPieces:
    """``{"items": [item or nil, ...]}`` in the order given (in pieces when a value is large,
    see the module)."""
    if SEND_AS_THEY_LIE and any(
        item is not None and len(item.value) >= LARGE_PIECE_BYTES for item in items
    ):
        return _as_they_lie(len(items), map(_item_row, items))
    out = [_ITEMS_MAP, array_header(len(items))]
    for item in items:
        if item is None:
            out.append(_NIL)
        else:
            _item_parts(item, out)
    return b"".join(out)


def _row_dtype(names: tuple[bytes, ...], codes: str) -> np.dtype[Any]:
    """A tail of named numbers as one numpy record: each name, then its number."""
    return np.dtype(
        [
            field
            for i, (name, code) in enumerate(zip(names, codes, strict=True))
            for field in ((f"n{i}", f"S{len(name)}"), (f"v{i}", ">f8" if code == "d" else ">u8"))
        ]
    )


#: The fixed tail of a sampled item, one row per pick, filled by numpy for a whole batch.
_SAMPLED_ROW = _row_dtype(_SAMPLED_NAMES, "dddQ")
#: The fixed tail of an item read (priority, inserted_at, times_sampled), the same way.
_ITEM_ROW = _row_dtype(_ITEM_NAMES, "ddQ")
#: ``_SAMPLED_HEAD`` + the str header of a key of ``n`` bytes, by ``n`` (every size allowed).
_SAMPLED_HEADS = [_SAMPLED_HEAD + str_header(n) for n in range(MAX_KEY_BYTES + 1)]
#: ``_ITEM_HEAD`` + the str header of a key of ``n`` bytes, by ``n``.
_ITEM_HEADS = [_ITEM_HEAD + str_header(n) for n in range(MAX_KEY_BYTES + 1)]


def _tails(row: np.dtype[Any], names: tuple[bytes, ...], *columns: Any) -> list[bytes]:
    """Each item's tail of ``names`` and their numbers (``columns``), as bytes."""
    rows = np.empty(len(columns[0]), dtype=row)
    for i, (name, column) in enumerate(zip(names, columns, strict=True)):
        rows[f"n{i}"] = name
        rows[f"v{i}"] = column
    tails: list[bytes] = rows.view(np.dtype(f"V{row.itemsize}")).tolist()
    return tails


def _sampled_tails(batch: SampleBatch) -> list[bytes]:
    """Each pick's ``priority, probability, weight, times_sampled`` entries, names included."""
    return _tails(
        _SAMPLED_ROW,
        _SAMPLED_NAMES,
        batch.priorities,
        batch.probabilities,
        batch.weights,
        batch.times_sampled,
    )


def item_batch_msgpack(batch: ItemBatch) -> bytes | AnswerPieces:
    """:func:`items_msgpack` of ``batch.items()``, the same bytes, with no Python step per
    item when every key was found and no item has a group, version or tags: the numeric
    tails packed by numpy at once, the pieces put in place by slice assignments."""
    if None in batch.values or batch.groups is not None or batch.tags is not None:
        return items_msgpack(batch.items())
    n = len(batch)
    values: list[bytes] = batch.values  # type: ignore[assignment]  # None is not in it
    tails = _tails(_ITEM_ROW, _ITEM_NAMES, batch.priorities, batch.inserted_at, batch.times_sampled)
    if SEND_AS_THEY_LIE and n and max(map(len, values)) >= LARGE_PIECE_BYTES:
        rows = zip(itertools.repeat(5), batch.keys, values, tails, strict=False)
        return _as_they_lie(n, rows)
    return _spliced(_ITEM_HEADS, batch.keys, values, tails)


def _or_nil(values: list[bytes | None]) -> list[bytes]:
    """The stored values, msgpack's nil where a value was not asked for."""
    if None not in values:
        return values  # type: ignore[return-value]  # None is not in it
    return [_NIL if value is None else value for value in values]


def sample_msgpack(batch: SampleBatch) -> bytes | AnswerPieces:
    """``{"items": [{"key", "value", "priority", "probability", "weight", "times_sampled"}]}``.

    The numeric tails of all picks are packed by numpy at once, and the answer's pieces are
    put in place by slice assignments, with no Python step per pick (but for an answer sent
    in pieces, see the module). The stored values are spliced in as they are; ``value`` is
    nil when asked without values.
    """
    n = len(batch)
    tails = _sampled_tails(batch)
    values = _or_nil(batch.values)
    if SEND_AS_THEY_LIE and n and max(map(len, values)) >= LARGE_PIECE_BYTES:
        return _as_they_lie(n, _sampled_rows(batch, values, tails))
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
    return _spliced(_SAMPLED_HEADS, batch.keys, values, tails)


def _spliced(
    heads: list[bytes], keys: Sequence[str], values: list[bytes], tails: list[bytes]
) -> bytes:
    """``{"items": [...]}`` of each key's head (by its length), key, value and tail, put
    in place by slice assignments (no Python step per item)."""
    n = len(keys)
    encoded = list(map(str.encode, keys))
    out = [_ITEMS_MAP + array_header(n)] * (5 * n + 1)  # the first stays; the rest are set
    out[1::5] = map(heads.__getitem__, map(len, encoded))
    out[2::5] = encoded
    out[3::5] = [_VALUE] * n
    out[4::5] = values
    out[5::5] = tails
    return b"".join(out)


# --- answers in pieces ------------------------------------------------------------------------

#: Answers with a value of :data:`LARGE_PIECE_BYTES` or more go out in pieces (off: joined;
#: ``python -m bench bulk --arms`` compares the two).
SEND_AS_THEY_LIE = True
#: The first array of each value starts at a multiple of this offset of an answer in pieces.
ALIGNMENT: Final = 8
#: An item's map entries, its key, its stored value and the bytes of its entries after the
#: value; None for a missing item (nil).
_Row = tuple[int, str, bytes, bytes] | None


def _item_row(item: Item | None) -> _Row:
    if item is None:
        return None
    p, i, t = _ITEM_NAMES
    extra = _rollout_parts(item.group, item.version, item.tags)
    tail = _ITEM_TAIL.pack(p, item.priority, i, item.inserted_at, t, item.times_sampled)
    return 5 + len(extra) // 2, item.key, item.value, b"".join([tail, *extra])


def _sampled_rows(batch: SampleBatch, values: list[bytes], tails: list[bytes]) -> Iterable[_Row]:
    n = len(batch)
    rollout = batch.groups is not None and batch.versions is not None
    groups = batch.groups if rollout and batch.groups is not None else [None] * n
    versions = batch.versions if rollout and batch.versions is not None else [None] * n
    tags = (batch.tags if rollout else None) or [None] * n
    for key, value, tail, group, version, tg in zip(
        batch.keys, values, tails, groups, versions, tags, strict=True
    ):
        extra = _rollout_parts(group, version, tg)
        yield 6 + len(extra) // 2, key, value, b"".join([tail, *extra])


def _as_they_lie(count: int, rows: Iterable[_Row]) -> AnswerPieces:
    """``{"items": [...]}`` of ``count`` rows as pieces: each large value the stored bytes
    where they lie, everything between two of them joined; each item's head padded so that
    its value's first array's data starts at a multiple of :data:`ALIGNMENT`."""
    pieces: list[bytes] = []
    small: list[bytes] = [_ITEMS_MAP, array_header(count)]
    pos = sum(map(len, small))  # bytes of the answer so far
    for row in rows:
        if row is None:
            small.append(_NIL)
            pos += 1
            continue
        entries, key, value, tail = row
        key_bytes = str_bytes(key)
        data = _first_data(value)
        pad = 0
        if data is not None:
            unpadded = sum(map(len, _padded_head(entries, 0)))
            pad = -(pos + unpadded + len(key_bytes) + data) % ALIGNMENT
        before_key, value_name = _padded_head(entries, pad)
        small += (before_key, key_bytes, value_name)
        pos += len(before_key) + len(key_bytes) + len(value_name) + len(value) + len(tail)
        if len(value) >= LARGE_PIECE_BYTES:
            pieces.append(b"".join(small))
            pieces.append(value)
            small = [tail]
        else:
            small += (value, tail)
    pieces.append(b"".join(small))
    return AnswerPieces(pieces, pos)


def _header_forms(marker: int, fix_limit: int, size: int) -> list[bytes]:
    """A map (``marker`` 0x80) or string (0xA0) header of ``size`` in each of its msgpack
    forms, shortest first."""
    wide = (0xDE, 0xDF) if marker == 0x80 else (0xDA, 0xDB)
    forms = [bytes((marker | size,))] if size < fix_limit else []
    if marker == 0xA0 and size < 0x100:
        forms.append(bytes((0xD9, size)))
    forms.append(bytes((wide[0],)) + size.to_bytes(2, "big"))
    return [*forms, bytes((wide[1],)) + size.to_bytes(4, "big")]


@functools.lru_cache(maxsize=128)
def _padded_head(entries: int, pad: int) -> tuple[bytes, bytes]:
    """An item's map header and ``"key"`` name, and its ``"value"`` name, ``pad`` bytes
    longer together than their shortest forms (``pad`` 0 to 7)."""
    maps = _header_forms(0x80, 16, entries)
    keys = [form + b"key" for form in _header_forms(0xA0, 32, 3)]
    names = [form + b"value" for form in _header_forms(0xA0, 32, 5)]
    shortest = len(maps[0]) + len(keys[0]) + len(names[0])
    for head, key, name in itertools.product(maps, keys, names):
        if len(head) + len(key) + len(name) == shortest + pad:
            return head + key, name
    raise ValueError(f"no head of {pad} bytes more")  # pragma: no cover - 0..7 all exist


_INT_WIDTHS: Final = {0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9}
_BIN_WIDTHS: Final = {0xC4: 2, 0xC5: 3, 0xC6: 5}


def _after_str(value: bytes, pos: int) -> int:
    """Where the msgpack string at ``value[pos]`` ends (-1 when there is none)."""
    head = value[pos]
    if 0xA0 <= head <= 0xBF:
        return pos + 1 + (head & 0x1F)
    if head == 0xD9:
        return pos + 2 + value[pos + 1]
    if head == 0xDA:
        return pos + 3 + int.from_bytes(value[pos + 1 : pos + 3], "big")
    return -1


def _first_data(value: bytes) -> int | None:
    """Where the data of the array in the first entry of ``value`` starts, when ``value`` is
    a map whose first entry is a string and an array (the common value); else None."""
    try:
        head = value[0]
        pos = 1 if 0x81 <= head <= 0x8F else 3 if head == 0xDE else 5 if head == 0xDF else -1
        if pos < 0 or (pos := _after_str(value, pos)) < 0:
            return None
        ext = read_ext_header(value, pos)
        if ext is None or ext[0] != EXT_NDARRAY or value[ext[1]] != 0x93:
            return None
        if (pos := _after_str(value, ext[1] + 1)) < 0 or not 0x90 <= value[pos] <= 0x9F:
            return None
        dims, pos = value[pos] & 0x0F, pos + 1
        for _ in range(dims):
            width = 1 if value[pos] < 0x80 else _INT_WIDTHS.get(value[pos])
            if width is None:
                return None
            pos += width
        width = _BIN_WIDTHS.get(value[pos])
        return None if width is None else pos + width
    except IndexError:
        return None


# --- JSON ---------------------------------------------------------------------------------------


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
