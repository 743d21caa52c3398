"""Stacking items' values into columns: the answers of sample and batchGet with
``layout: "columns"``.

Each value must be a map with the same fields as the others; each field is stacked along a
new first axis: arrays of one dtype and shape into one array, a 1-D field whose length
varies packed end to end with its int32 offsets as ``"<field>.cu_seqlens"`` (``n + 1``,
the layout of flash-attention's varlen kernels), and scalars into ``|b1``, ``<i8`` or
``<f8`` arrays (whatever the values, so that a field's dtype never depends on the batch:
an int past 2**63 - 1 is refused). Anything else is refused with
:class:`~rlreplay.wire.errors.ValidationFailed` naming the field.

The values are the msgpack bytes stored for the items. When they share one layout (the
same fields, dtypes and shapes, so the same bytes but for the data, the common case), the
first value is read once to find where each field's data lies, every value is checked to
have the same bytes elsewhere, and each column is gathered from all values with one NumPy
operation. Otherwise each value is decoded (:func:`_stack_decoded`); the result is the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt

from rlreplay.wire.arrays import BFLOAT16, dtype_info, split_payload, wire_dtype
from rlreplay.wire.errors import ValidationFailed
from rlreplay.wire.headers import read_ext_header

__all__ = ["CU_SEQLENS", "ROW_SLICES_BYTES", "Column", "RowSlices", "stack_values"]

#: The suffix of the offsets column of a variable-length field.
CU_SEQLENS: Final = ".cu_seqlens"


#: Values this long or longer are stacked from slices of each value, never joined: the answer
#: sends each slice where it lies (one ``writev``), where a joined copy would be copied again
#: into the answer. Shorter values are joined once: a slice per value costs more than them.
ROW_SLICES_BYTES: Final = 4 << 10


class RowSlices:
    """A column's data as one slice of each value (its rows, in order), not joined."""

    __slots__ = ("nbytes", "rows")

    def __init__(self, rows: list[memoryview]) -> None:
        self.rows = rows
        self.nbytes = sum(map(len, rows))


@dataclass(frozen=True, slots=True)
class Column:
    """One stacked field: an array in its wire form.

    Attributes:
        dtype: The wire dtype string (``"<f4"``, ``"bfloat16"``...).
        shape: The array's shape, items first.
        data: The C-order bytes: any contiguous buffer, a NumPy ``uint8`` array that may
            be a strided view (one row per item) of the values it was gathered from, or
            :class:`RowSlices` of large values.
    """

    dtype: str
    shape: tuple[int, ...]
    data: Any

    @classmethod
    def of(cls, array: npt.NDArray[Any]) -> Column:
        """The column of a NumPy array."""
        return cls(wire_dtype(array.dtype), array.shape, np.ascontiguousarray(array))

    @property
    def nbytes(self) -> int:
        """Bytes of data."""
        if type(self.data) is RowSlices:
            return self.data.nbytes
        return memoryview(self.data).nbytes

    def contiguous(self) -> Any:
        """The data as one contiguous buffer (copied only if it is a strided view or in
        slices)."""
        if type(self.data) is np.ndarray:
            return np.ascontiguousarray(self.data)
        if type(self.data) is RowSlices:
            return b"".join(self.data.rows)
        return self.data


def stack_values(keys: Sequence[str], values: Sequence[bytes]) -> dict[str, Column]:
    """The columns of the items' values, by field, in the first value's order.

    Args:
        keys: The items' keys (for error messages).
        values: Their stored msgpack values.

    Returns:
        Field name -> column (no columns for no items).

    Raises:
        ValidationFailed: The values cannot be stacked; the message names the field.
    """
    if not values:
        return {}
    layout = _layout(values[0])
    if layout is not None:
        stacked = _stack_shared(values, *layout)
        if stacked is not None:
            return stacked
    return _stack_decoded(keys, values)


# --- values that share a layout ----------------------------------------------------------------

_ARRAY, _FLOAT, _BOOL, _FIXINT, _INT = range(5)
_INT_MARKERS: Final = {
    0xCC: ">u1", 0xCD: ">u2", 0xCE: ">u4", 0xCF: ">u8",
    0xD0: ">i1", 0xD1: ">i2", 0xD2: ">i4", 0xD3: ">i8",
}  # fmt: skip
_STR_SIZE_BYTES: Final = {0xD9: 1, 0xDA: 2, 0xDB: 4}
_INT64_MAX: Final = 2**63 - 1


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where a field's data lies in a value: ``size`` bytes from ``start``."""

    name: str
    kind: int
    start: int
    size: int
    dtype: str  # the data's dtype as laid out: the array's, or the msgpack number's
    shape: tuple[int, ...] = ()


def _sized(value: bytes, pos: int, width: int) -> tuple[int, int]:
    end = pos + width
    return int.from_bytes(value[pos:end], "big"), end


def _layout(value: bytes) -> tuple[list[_Slot], npt.NDArray[np.intp]] | None:
    """The slots of a map of arrays and scalars with string keys, and the positions of all
    its other bytes; None for any other value (decoded instead)."""
    try:
        return _read_layout(value)
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def _read_layout(value: bytes) -> tuple[list[_Slot], npt.NDArray[np.intp]] | None:
    head = value[0]
    if 0x80 <= head <= 0x8F:
        count, pos = head & 0x0F, 1
    elif head in (0xDE, 0xDF):
        count, pos = _sized(value, 1, 2 if head == 0xDE else 4)
    else:
        return None
    slots: list[_Slot] = []
    names: set[str] = set()
    for _ in range(count):
        marker = value[pos]
        if 0xA0 <= marker <= 0xBF:
            length, pos = marker & 0x1F, pos + 1
        elif marker in _STR_SIZE_BYTES:
            length, pos = _sized(value, pos + 1, _STR_SIZE_BYTES[marker])
        else:
            return None
        name = value[pos : pos + length].decode("utf-8")
        pos += length
        if name in names:
            return None
        names.add(name)
        slot = _slot(value, pos, name)
        if slot is None:
            return None
        slots.append(slot)
        pos = slot.start + slot.size
    if pos != len(value):
        return None
    if len(value) >= ROW_SLICES_BYTES:  # compared run by run (_same_skeleton), not by index
        return slots, np.empty(0, dtype=np.intp)
    skeleton = np.ones(len(value), dtype=bool)
    for slot in slots:
        skeleton[slot.start : slot.start + slot.size] = False
    return slots, np.flatnonzero(skeleton)


def _slot(value: bytes, pos: int, name: str) -> _Slot | None:
    """The slot of the field value at ``pos`` (None: not an array or a plain scalar)."""
    ext = read_ext_header(value, pos)
    if ext is not None:
        code, start, size = ext
        if code != 1 or start + size > len(value):
            return None
        dtype, shape, data = split_payload(memoryview(value)[start : start + size])
        return _Slot(name, _ARRAY, start + size - len(data), len(data), dtype, shape)
    marker = value[pos]
    if marker == 0xCB:
        return _Slot(name, _FLOAT, pos + 1, 8, ">f8")
    if marker == 0xCA:
        return _Slot(name, _FLOAT, pos + 1, 4, ">f4")
    if marker in (0xC2, 0xC3):
        return _Slot(name, _BOOL, pos, 1, "|u1")
    if marker < 0x80 or marker >= 0xE0:
        return _Slot(name, _FIXINT, pos, 1, "|i1")
    int_dtype = _INT_MARKERS.get(marker)
    if int_dtype is None:
        return None
    return _Slot(name, _INT, pos + 1, int(int_dtype[2]), int_dtype)


def _stack_shared(
    values: Sequence[bytes], slots: list[_Slot], skeleton: npt.NDArray[np.intp]
) -> dict[str, Column] | None:
    """The columns of values laid out as the first; None when one is not."""
    n, width = len(values), len(values[0])
    if len(set(map(len, values))) != 1:
        return None
    if width >= ROW_SLICES_BYTES:  # large values: checked and read where they lie
        if not _same_skeleton(values, slots, width):
            return None
        rows = None
    else:
        rows = np.frombuffer(b"".join(values), dtype=np.uint8).reshape(n, width)
        if n > 1 and skeleton.size and not (rows[1:, skeleton] == rows[0, skeleton]).all():
            return None
    columns: dict[str, Column] = {}
    for slot in slots:
        end = slot.start + slot.size
        if slot.kind == _ARRAY:  # gathered when the answer is written
            data: Any = rows[:, slot.start : end] if rows is not None else None
            if data is None:
                views = [memoryview(value) for value in values]
                data = RowSlices(list(map(itemgetter(slice(slot.start, end)), views)))
            columns[slot.name] = Column(slot.dtype, (n, *slot.shape), data)
            continue
        if rows is not None:
            cells = rows[:, slot.start : end]
        else:
            joined = b"".join(map(itemgetter(slice(slot.start, end)), values))
            cells = np.frombuffer(joined, dtype=np.uint8).reshape(n, slot.size)
        if slot.kind == _BOOL:
            byte = cells[:, 0]
            if not ((byte == 0xC2) | (byte == 0xC3)).all():
                return None
            stacked: npt.NDArray[Any] = byte == 0xC3
        elif slot.kind == _FIXINT:
            byte = cells[:, 0]
            if not ((byte < 0x80) | (byte >= 0xE0)).all():
                return None
            stacked = byte.view(np.int8).astype(np.int64)
        else:
            numbers = np.ascontiguousarray(cells).view(slot.dtype).reshape(n)
            if slot.kind == _FLOAT:
                with np.errstate(invalid="ignore"):  # a float32 signalling NaN, quieted
                    stacked = numbers.astype(np.float64)
            elif slot.dtype == ">u8" and n and int(numbers.max()) > _INT64_MAX:
                return None  # refused, by name, when decoded
            else:
                stacked = numbers.astype(np.int64)
        columns[slot.name] = Column.of(stacked)
    return columns


def _same_skeleton(values: Sequence[bytes], slots: list[_Slot], width: int) -> bool:
    """Whether every value has the first one's bytes outside its slots (C loops, one per
    run of such bytes: no joined copy of the values)."""
    edges = [0]
    for slot in slots:
        edges += (slot.start, slot.start + slot.size)
    edges.append(width)
    for start, end in zip(edges[::2], edges[1::2], strict=True):
        if end > start and len(set(map(itemgetter(slice(start, end)), values))) != 1:
            return False
    return True


# --- values decoded one by one -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Ext:
    """A msgpack extension inside a value, its payload left where it is."""

    code: int
    payload: memoryview


_DECODER: Final = msgspec.msgpack.Decoder(ext_hook=_Ext)
_SCALAR_DTYPES: Final[dict[str, type[np.generic]]] = {
    "a bool": np.bool_,
    "an int": np.int64,
    "a float": np.float64,
}


def _kind(element: Any) -> str:
    if isinstance(element, _Ext):
        return "an array" if element.code == 1 else f"an extension of type {element.code}"
    names = {bool: "a bool", int: "an int", float: "a float", str: "a string", bytes: "bytes"}
    names |= {dict: "a map", list: "a list", type(None): "null"}
    return names.get(type(element), type(element).__name__)


def _decoded_maps(keys: Sequence[str], values: Sequence[bytes]) -> list[dict[Any, Any]]:
    maps = []
    for key, value in zip(keys, values, strict=True):
        try:
            decoded = _DECODER.decode(value)
        except (msgspec.DecodeError, ValueError, RecursionError) as exc:
            raise ValidationFailed(f"item {key!r}: its value cannot be read: {exc}") from None
        if not isinstance(decoded, dict):
            raise ValidationFailed(
                f"item {key!r}: its value is {_kind(decoded)}; only maps of arrays and "
                'scalars stack into columns (ask for layout "items")'
            )
        maps.append(decoded)
    return maps


def _stack_decoded(keys: Sequence[str], values: Sequence[bytes]) -> dict[str, Column]:
    """The columns of values decoded one by one (fields in any order, lengths varying)."""
    maps = _decoded_maps(keys, values)
    fields = list(maps[0])
    for name in fields:
        if not isinstance(name, str):
            raise ValidationFailed(f"item {keys[0]!r}: field {name!r} is not a string")
    for key, fields_of in zip(keys, maps, strict=True):
        if fields_of.keys() != maps[0].keys():
            odd = sorted(map(repr, fields_of.keys() ^ maps[0].keys()))[0]
            raise ValidationFailed(
                f"field {odd}: items {keys[0]!r} and {key!r} have different fields, "
                "so their values do not stack"
            )
    columns: dict[str, Column] = {}
    for name in fields:
        elements = [fields_of[name] for fields_of in maps]
        for column_name, column in _stack_field(name, keys, elements):
            if column_name in columns or (column_name in maps[0] and column_name != name):
                raise ValidationFailed(
                    f"field {column_name!r}: the offsets of variable-length field {name!r} "
                    "would take its name"
                )
            columns[column_name] = column
    return columns


def _stack_field(name: str, keys: Sequence[str], elements: list[Any]) -> list[tuple[str, Column]]:
    kinds = {_kind(e) for e in elements}
    if len(kinds) > 1:
        first = _kind(elements[0])
        i = next(i for i, e in enumerate(elements) if _kind(e) != first)
        raise ValidationFailed(
            f"field {name!r}: item {keys[0]!r} holds {first} and item {keys[i]!r} "
            f"{_kind(elements[i])}; they do not stack"
        )
    kind = kinds.pop()
    if kind == "an array":
        return _stack_arrays(name, keys, elements)
    dtype = _SCALAR_DTYPES.get(kind)
    if dtype is None:
        raise ValidationFailed(f"field {name!r}: {kind} does not stack into a column")
    try:
        stacked: npt.NDArray[Any] = np.array(elements, dtype=dtype)
    except OverflowError:
        raise ValidationFailed(
            f"field {name!r}: an int past 2**63 - 1 does not stack into an int64 column"
        ) from None
    return [(name, Column.of(stacked))]


def _stack_arrays(name: str, keys: Sequence[str], elements: list[_Ext]) -> list[tuple[str, Column]]:
    parts = []
    for key, element in zip(keys, elements, strict=True):
        try:
            parts.append(split_payload(element.payload))
        except ValueError as exc:
            raise ValidationFailed(f"field {name!r} of item {key!r}: {exc}") from None
    dtype, shape, _ = parts[0]
    for i, (other_dtype, other_shape, _) in enumerate(parts):
        if other_dtype != dtype:
            raise ValidationFailed(
                f"field {name!r}: item {keys[0]!r} holds {dtype} and item {keys[i]!r} "
                f"{other_dtype}; they do not stack"
            )
        if other_shape != shape and (len(shape) != 1 or len(other_shape) != 1):
            raise ValidationFailed(
                f"field {name!r}: shapes {list(shape)} (item {keys[0]!r}) and "
                f"{list(other_shape)} (item {keys[i]!r}) do not stack; only a 1-D field "
                "may vary in length"
            )
    rows = [part[2] for part in parts]
    total = sum(map(len, rows))
    # rows of 16 KiB and more are gathered into the answer as they lie, not joined first
    data = RowSlices(rows) if total >= len(rows) * (16 << 10) else b"".join(rows)
    lengths = [part[1][0] for part in parts] if len(shape) == 1 else []
    if not lengths or min(lengths) == max(lengths):
        return [(name, Column(dtype, (len(parts), *shape), data))]
    itemsize = 2 if dtype == BFLOAT16 else dtype_info(dtype)[1]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValidationFailed(f"field {name!r}: {offsets[-1]} elements overflow int32 offsets")
    assert total == offsets[-1] * itemsize
    return [
        (name, Column(dtype, (int(offsets[-1]),), data)),
        (name + CU_SEQLENS, Column.of(offsets.astype(np.int32))),
    ]
