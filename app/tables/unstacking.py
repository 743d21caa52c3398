"""Items out of columns: the values of a columnar push body.

Item ``i`` of ``{"keys", "columns": {field: array}}`` gets the value ``{field:
columns[field][i], ...}``, stored as the very bytes the client's codec
(:func:`rlreplay.wire.codec.packb`) gives that map, so that the item reads back as if it had
been pushed in the per-item form. Indexing an array's first axis gives:

* an array of the remaining shape, when the column has two axes or more;
* for a 1-D column, the NumPy scalar, which the codec sends as the Python scalar: a bool,
  an int (its shortest msgpack form), a float (float64); complex numbers and long doubles
  have none and travel as 0-d arrays in the machine's byte order (a NumPy scalar's), and a
  bfloat16 element as a 0-d bfloat16 array; other dtypes (strings, dates) are packed by the
  codec, element by element.

Each field's encoding is laid out for all items at once with NumPy: its header, built once,
is repeated on every row, and the rows' data is the column's data cut by items; the items'
bytes are then cut from one buffer, or, when the rows are wide, joined from slices of the
columns (one copy of the data). Only ints whose msgpack form varies in length within a
column, the dtypes packed element by element, and the join make per-item work.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt

from rlreplay.wire.arrays import BFLOAT16, array_head, dtype_info, split_payload, zero_padding
from rlreplay.wire.codec import packb
from rlreplay.wire.errors import BadRequest, ValidationFailed
from rlreplay.wire.headers import int_bytes, map_header, map_size, read_ext_header, str_bytes

__all__ = ["ColumnIn", "checked_column", "msgpack_columns", "unstack_values"]


@dataclass(frozen=True, slots=True)
class ColumnIn:
    """A pushed column: the array ``columns[name]``, its first axis the items.

    Attributes:
        name: The field's name.
        dtype: The wire dtype string (normalised, see :func:`~rlreplay.wire.arrays.dtype_info`).
        shape: The array's shape; ``shape[0]`` is the number of items.
        data: Its C-order bytes.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: memoryview


#: Where a 1-D int column's values fall among msgpack's int forms: the bounds of each form,
#: and per form its marker (None: a fixint, the value itself) and big-endian data type.
_INT_BOUNDS: Final = np.array(
    [-(2**31), -(2**15), -(2**7), -32, 2**7, 2**8, 2**16, 2**32], dtype=np.float64
)
_INT_FORMS: Final = (
    (0xD3, ">i8"), (0xD2, ">i4"), (0xD1, ">i2"), (0xD0, ">i1"), (None, "|u1"),
    (0xCC, ">u1"), (0xCD, ">u2"), (0xCE, ">u4"), (0xCF, ">u8"),
)  # fmt: skip

_NAMES: Final = msgspec.msgpack.Decoder(dict[Any, msgspec.Raw])

#: Bytes per column per item (on average over the columns) from which items are joined from
#: slices of the columns (one copy of the data, a Python step per item and column) rather than
#: cut from one side-by-side buffer (three copies, in C): ``python -m bench.fast_paths``
#: measures both.
JOIN_ROW_BYTES = 1024

#: Cells: the bytes of one field's value for every item: rows of equal width (a header the
#: rows share, then each row's own bytes, a view where it can be), or one ``bytes`` per item.
_Rows = tuple[bytes, npt.NDArray[np.uint8]]
_Cells = _Rows | list[bytes]


# --- reading a columnar body ----------------------------------------------------------------


def checked_column(
    name: Any, dtype: str, shape: tuple[int, ...], data: memoryview, n: int
) -> ColumnIn:
    """The column ``name`` of a columnar push of ``n`` items.

    Raises:
        ValidationFailed: The name is not a string, or the first axis is not ``n`` long.
    """
    if not isinstance(name, str):
        raise ValidationFailed(f"columns: the field name {name!r} is not a string")
    if not shape:
        raise ValidationFailed(f"columns[{name!r}] is 0-d: its first axis must hold {n} items")
    if shape[0] != n:
        raise ValidationFailed(
            f"columns[{name!r}]: its first axis is {shape[0]} long, but there are {n} keys"
        )
    return ColumnIn(name, dtype, shape, data)


def msgpack_columns(raw: msgspec.Raw | bytes | memoryview, n: int) -> list[ColumnIn]:
    """The columns of a msgpack ``columns`` map (field name -> array) for ``n`` items: each
    array's data is read where it lies in ``raw``.

    Raises:
        BadRequest: Not a map, or a field that is not an array.
        ValidationFailed: A field named twice or not by a string, or an array whose first
            axis is not ``n`` long.
    """
    try:
        named: dict[Any, msgspec.Raw] = _NAMES.decode(raw)
    except msgspec.ValidationError:
        raise BadRequest("columns must be a map of field name to array") from None
    except (msgspec.DecodeError, ValueError, RecursionError) as exc:  # a map as a name
        raise ValidationFailed(f"columns: a field name is not a string ({exc})") from exc
    if map_size(memoryview(raw)) != len(named):
        raise ValidationFailed("columns: a field is named twice")
    return [_msgpack_column(name, memoryview(value), n) for name, value in named.items()]


def _msgpack_column(name: Any, encoded: memoryview, n: int) -> ColumnIn:
    ext = read_ext_header(encoded)
    if ext is None or ext[0] != 1:
        raise BadRequest(f"columns[{name!r}] must be an array (msgpack extension type 1)")
    _, start, size = ext
    try:
        dtype, shape, data = split_payload(encoded[start : start + size])
    except ValueError as exc:
        raise BadRequest(f"columns[{name!r}]: {exc}") from None
    return checked_column(name, dtype, shape, data, n)


# --- building the values ---------------------------------------------------------------------


def unstack_values(columns: Sequence[ColumnIn], n: int) -> list[bytes]:
    """The msgpack values of ``n`` items, ``{field: column[i]}`` in the columns' order.

    Args:
        columns: The columns, each with ``shape[0] == n`` (checked by the caller).
        n: The number of items.

    Returns:
        One value per item.

    Raises:
        ValidationFailed: A column's elements have no wire form (naming the field).
    """
    if n == 0:
        return []
    pieces: list[bytes | _Cells] = [map_header(len(columns))]
    for column in columns:
        pieces.append(str_bytes(column.name))
        pieces.append(_cells(column, n))
    if not any(isinstance(p, list) for p in pieces):
        return _rows(pieces, n)
    streams = [itertools.repeat(p) if isinstance(p, bytes) else _split(p, n) for p in pieces]
    return [b"".join(parts) for parts in zip(*streams, strict=False)]


def _rows(pieces: list[Any], n: int) -> list[bytes]:
    """Values of fixed width: joined item by item from slices of each column's rows when
    the rows are wide, else every piece written side by side into one buffer and each
    item's bytes cut from its row."""
    parts: list[bytes | npt.NDArray[np.uint8]] = []
    for piece in pieces:
        if isinstance(piece, tuple):
            parts += piece
        else:
            parts.append(piece)
    rows = [p for p in parts if not isinstance(p, bytes)]
    row_bytes = sum(r.shape[1] for r in rows)
    if row_bytes and row_bytes >= JOIN_ROW_BYTES * len(rows):
        if all(r.flags.c_contiguous for r in rows):
            return _joined(parts, n)
    widths = [len(p) if isinstance(p, bytes) else p.shape[1] for p in parts]
    out = np.empty((n, sum(widths)), dtype=np.uint8)
    at = 0
    for part, width in zip(parts, widths, strict=True):
        if width:
            out[:, at : at + width] = (
                np.frombuffer(part, dtype=np.uint8) if isinstance(part, bytes) else part
            )
        at += width
    # one copy out of the buffer, then a bytes slice per row: cheaper than bytes() of each
    # row, which makes an array view per row first
    flat, width = out.tobytes(), out.shape[1]
    if not width:
        return [b""] * n
    return [flat[start : start + width] for start in range(0, len(flat), width)]


def _joined(parts: list[bytes | npt.NDArray[np.uint8]], n: int) -> list[bytes]:
    """Each item's value joined from the shared pieces and a slice of each column's rows
    (C-contiguous, at least one not empty): the data is copied once, where the side-by-side
    buffer copies it three times."""
    streams: list[Any] = []
    shared: list[bytes] = []
    for part in parts:
        if isinstance(part, bytes) or not part.shape[1]:  # an empty row adds nothing
            shared.append(part if isinstance(part, bytes) else b"")
            continue
        if shared:
            streams.append(itertools.repeat(b"".join(shared)))
            shared = []
        width = part.shape[1]
        view = part.reshape(-1).data
        streams.append([view[start : start + width] for start in range(0, n * width, width)])
    if shared:
        streams.append(itertools.repeat(b"".join(shared)))
    return list(map(b"".join, zip(*streams, strict=False)))  # the shared pieces repeat


def _split(cells: _Cells, n: int) -> list[bytes]:
    if isinstance(cells, list):
        return cells
    head, rows = cells
    return [head + row for row in map(bytes, rows)]


def _cells(column: ColumnIn, n: int) -> _Cells:
    dtype_str, itemsize, dtype = dtype_info(column.dtype)
    element_shape = column.shape[1:]
    data = np.frombuffer(column.data, dtype=np.uint8)
    kind = dtype.kind
    if not element_shape and (kind == "c" or (kind == "f" and itemsize > 8)):
        # a NumPy scalar is in the machine's byte order, and so is the 0-d array it becomes
        native = np.frombuffer(column.data, dtype=dtype).astype(dtype.newbyteorder("="))
        zero_padding(native)  # as the scalar's packing does
        dtype_str, data = native.dtype.str, native.view(np.uint8)
    if element_shape or dtype_str == BFLOAT16 or kind == "c" or (kind == "f" and itemsize > 8):
        element_bytes = len(data) // n
        head = array_head(dtype_str, element_shape, element_bytes)
        return head, data.reshape(n, element_bytes)
    values = np.frombuffer(column.data, dtype=dtype)
    if kind == "f":
        with np.errstate(invalid="ignore"):  # a signalling NaN is quieted, as by float()
            return _marked(0xCB, values.astype(">f8"))
    if kind == "b":
        return b"", np.where(data != 0, 0xC3, 0xC2).astype(np.uint8).reshape(n, 1)
    if kind in "iu":
        return _int_cells(values)
    return _packed_one_by_one(column, values)


def _marked(marker: int, values: npt.NDArray[Any]) -> _Rows:
    """Rows of ``marker`` followed by each value's bytes (in the values' byte order)."""
    raw = np.ascontiguousarray(values).view(np.uint8).reshape(len(values), values.dtype.itemsize)
    return bytes((marker,)), raw


def _int_cells(values: npt.NDArray[Any]) -> _Cells:
    """The msgpack ints of a column: rows when every value takes the same form."""
    if values.dtype.kind == "u":
        wide = values.astype(np.uint64)
        forms = np.searchsorted(_INT_BOUNDS[4:], wide, side="right") + 4
    else:
        wide = values.astype(np.int64)
        forms = np.searchsorted(_INT_BOUNDS, wide, side="right")
    form = int(forms[0])
    if (forms != form).any():
        return [int_bytes(v) for v in wide.tolist()]
    marker, dtype = _INT_FORMS[form]
    if marker is None:
        return b"", (wide & 0xFF).astype(np.uint8).reshape(len(wide), 1)
    return _marked(marker, wide.astype(dtype))


def _packed_one_by_one(column: ColumnIn, values: npt.NDArray[Any]) -> list[bytes]:
    """Cells of the dtypes whose scalars the codec turns into other Python objects."""
    if values.dtype.kind == "U":  # NumPy fails with a SystemError on a code point past Unicode
        codes = np.ascontiguousarray(values).view(
            np.dtype("u4").newbyteorder(values.dtype.byteorder)
        )
        if (codes > 0x10FFFF).any():
            raise ValidationFailed(
                f"columns[{column.name!r}]: its {column.dtype} elements hold a code point "
                "past U+10FFFF"
            )
    try:
        return [packb(value) for value in values]
    except (TypeError, ValueError) as exc:
        raise ValidationFailed(
            f"columns[{column.name!r}]: its {column.dtype} elements have no wire form: {exc}"
        ) from None
