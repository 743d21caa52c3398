"""Answers of sample and batchGet with ``layout: "columns"``, in msgpack or JSON.

``{"keys", "priorities", "probabilities", "weights", "times_sampled", "columns"}`` for a
sample, ``{"keys", "priorities", "times_sampled", "columns", "missing"}`` for a batchGet
(:class:`~rlreplay.wire.schemas.SampleColumns`, :class:`~rlreplay.wire.schemas.ItemColumns`).
The columns come from :func:`~rlreplay.app.tables.stacking.stack_values`. In msgpack every
array is extension type 1, laid out here around the stacked data; in JSON the contract's
``{"$ndarray": {"dtype", "shape", "data"}}`` form.

A msgpack answer is written into a buffer reused across requests (a
:class:`~rlreplay.wire.buffer_pool.BufferPool`'s, handed out again only once the transport
has sent it and nothing else holds it): a fresh buffer of many MiB costs more in page faults
than the copy into it. Each array's data starts at an offset of the answer that is a
multiple of 8, so a client that reads the answer into an aligned buffer can use every
column in place (:func:`aligned_array_head`).
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt

from rlreplay.app.api.gathered_writes import AnswerPieces
from rlreplay.app.tables.items import ItemBatch, SampleBatch
from rlreplay.app.tables.stacking import Column, RowSlices, stack_values
from rlreplay.wire.arrays import EXT_NDARRAY, array_head
from rlreplay.wire.buffer_pool import BufferPool
from rlreplay.wire.headers import bin_header, ext_header, int_bytes, map_header, str_bytes

__all__ = [
    "FoundColumns",
    "item_columns_json",
    "item_columns_msgpack",
    "sample_columns_json",
    "sample_columns_msgpack",
    "window_columns_json",
    "window_columns_msgpack",
]


class FoundColumns:
    """The items a batchGet found, stacked, and the keys it did not find."""

    __slots__ = ("columns", "keys", "missing", "priorities", "times_sampled")

    def __init__(self, batch: ItemBatch) -> None:
        """Stacks the values found in ``batch``.

        Raises:
            ValidationFailed: They do not stack (the message names the field).
        """
        self.priorities: npt.NDArray[np.float64] = batch.priorities
        self.times_sampled: npt.NDArray[np.int64] = batch.times_sampled
        self.missing: list[str] = []
        if None not in batch.values:  # every key found: no step per item
            self.keys = list(batch.keys)
            self.columns = stack_values(self.keys, batch.values)  # type: ignore[arg-type]
            return
        found = [i for i, value in enumerate(batch.values) if value is not None]
        index = np.asarray(found, dtype=np.int64)
        self.keys = [batch.keys[i] for i in found]
        pairs = zip(batch.keys, batch.values, strict=True)
        self.missing = [key for key, value in pairs if value is None]
        self.priorities = batch.priorities[index]
        self.times_sampled = batch.times_sampled[index]
        values: list[bytes] = [batch.values[i] for i in found]  # type: ignore[misc]
        self.columns = stack_values(self.keys, values)


# --- msgpack -----------------------------------------------------------------------------------

_LISTS: Final = msgspec.msgpack.Encoder()
#: Where msgpack answers are written (the event loop's alone: answers are built on it).
_ANSWERS: Final = BufferPool(max_buffers=4)
#: Array data starts at a multiple of this offset of the answer (the widest NumPy alignment).
ALIGNMENT: Final = 8
#: Large values' slices go to the socket where they lie (off: gathered into one buffer;
#: ``python -m bench bulk --arms`` compares the two).
SEND_AS_THEY_LIE = True
#: A window answer whose arrays hold this many bytes is sent as they lie, not copied.
WINDOWS_AS_THEY_LIE = 1 << 20


def _str_forms(text: str) -> list[bytes]:
    """Every msgpack header of a string of ``text``'s length, shortest first."""
    n = len(text.encode())
    forms = [bytes((0xA0 | n,))] if n < 32 else []
    if n < 0x100:
        forms.append(bytes((0xD9, n)))
    if n < 0x10000:
        forms.append(b"\xda" + n.to_bytes(2, "big"))
    return [*forms, b"\xdb" + n.to_bytes(4, "big")]


def _int_forms(value: int) -> list[bytes]:
    """Every msgpack form of the non-negative int ``value``, shortest first."""
    forms = [bytes((value,))] if value < 0x80 else []
    for marker, width in ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)):
        if value < 1 << (8 * width):
            forms.append(bytes((marker,)) + value.to_bytes(width, "big"))
    return forms


def _array_header_forms(size: int) -> list[bytes]:
    forms = [bytes((0x90 | size,))] if size < 16 else []
    return [*forms, b"\xdc" + size.to_bytes(2, "big"), b"\xdd" + size.to_bytes(4, "big")]


@functools.lru_cache(maxsize=1024)
def aligned_array_head(dtype: str, shape: tuple[int, ...], nbytes: int, offset: int) -> bytes:
    """The bytes of an ext-1 array before its data, when they start at answer offset
    ``offset`` (mod :data:`ALIGNMENT`): the shortest such head after which the data starts at
    a multiple of :data:`ALIGNMENT`.

    msgpack lets a string, an array header and an int take longer forms than the shortest,
    which every decoder reads the same; the dtype's string, the shape's array header and
    its first axis take the forms that pad the head to the alignment.
    """
    rest = b"".join([int_bytes(dim) for dim in shape[1:]]) + bin_header(nbytes)
    name = dtype.encode()
    first = _int_forms(shape[0]) if shape else [b""]
    best: bytes | None = None
    for str_head in _str_forms(dtype):
        for shape_head in _array_header_forms(len(shape)):
            for dim in first:
                payload = b"\x93" + str_head + name + shape_head + dim + rest
                head = ext_header(EXT_NDARRAY, len(payload) + nbytes) + payload
                if (offset + len(head)) % ALIGNMENT == 0 and (
                    best is None or len(head) < len(best)
                ):
                    best = head
    return best if best is not None else array_head(dtype, shape, nbytes)


def _entries(
    entries: Sequence[tuple[str, Any]], *, lie_bytes: int | None = None
) -> memoryview | AnswerPieces:
    """A msgpack map of lists of strings, arrays and maps of columns, laid out by hand.

    An answer with large values (:class:`RowSlices`, not copied here) is left in pieces,
    sent as they lie (:mod:`rlreplay.app.api.gathered_writes`), and so is one whose arrays
    hold ``lie_bytes`` or more (arrays nobody writes again). Any other is written into
    one buffer: each column's data is copied once, straight from where stacking left it,
    and everything between two columns is joined into one piece first.
    """
    pieces: list[Any] = []  # bytes, and the columns' data
    small: list[bytes] = [map_header(len(entries))]
    written = 0  # bytes in pieces

    def array(column: Column) -> None:
        nonlocal written
        joined = b"".join(small)
        nbytes = column.nbytes
        head = aligned_array_head(
            column.dtype, column.shape, nbytes, (written + len(joined)) % ALIGNMENT
        )
        pieces.append(joined + head)
        small.clear()
        pieces.append(column.data)
        written += len(joined) + len(head) + nbytes

    for name, value in entries:
        small.append(str_bytes(name))
        if isinstance(value, list | int | float):
            small.append(_LISTS.encode(value))  # strings (in C), or a plain number
        elif isinstance(value, dict):
            small.append(map_header(len(value)))
            for field, column in value.items():
                small.append(str_bytes(field))
                array(column)
        else:
            array(Column.of(value))
    pieces.append(b"".join(small))
    arrays = [piece for piece in pieces if type(piece) is np.ndarray]
    large = any(type(piece) is RowSlices for piece in pieces) or (
        lie_bytes is not None and sum(a.nbytes for a in arrays) >= lie_bytes
    )
    if SEND_AS_THEY_LIE and large and all(a.flags.c_contiguous for a in arrays):
        return _as_they_lie(pieces, written + len(pieces[-1]))
    sizes = [
        piece.nbytes if type(piece) is RowSlices else memoryview(piece).nbytes for piece in pieces
    ]
    answer = _ANSWERS.take(sum(sizes))
    out = np.frombuffer(answer, dtype=np.uint8)
    pos = 0
    for piece, size in zip(pieces, sizes, strict=True):
        if size:
            target = out[pos : pos + size]
            if type(piece) is RowSlices:  # large values: a copy of each row, in place
                row_pos = pos
                for row in piece.rows:
                    answer[row_pos : row_pos + len(row)] = row
                    row_pos += len(row)
            elif type(piece) is np.ndarray:
                if piece.dtype != np.uint8:  # a column of numbers: its bytes
                    piece = np.ascontiguousarray(piece).reshape(-1).view(np.uint8)
                target.reshape(piece.shape)[...] = piece  # a strided view: the gather
            else:
                target[...] = np.frombuffer(piece, dtype=np.uint8)
        pos += size
    return answer


def _as_they_lie(pieces: list[Any], nbytes: int) -> AnswerPieces:
    """The answer as buffers to send in order: each large value's slice where it lies."""
    out: list[Any] = []
    for piece in pieces:
        if type(piece) is RowSlices:
            out += piece.rows
        elif type(piece) is np.ndarray:
            out.append(piece.data.cast("B"))  # contiguous: its bytes as they are
        elif len(piece):
            out.append(piece)
    return AnswerPieces(out, nbytes)


def sample_columns_msgpack(batch: SampleBatch) -> memoryview | AnswerPieces:
    """The msgpack answer of a sample with ``layout: "columns"`` (its ``columns`` set)."""
    return _entries(_sample_entries(batch))


def item_columns_msgpack(found: FoundColumns) -> memoryview | AnswerPieces:
    """The msgpack answer of a batchGet with ``layout: "columns"``."""
    return _entries(_item_entries(found))


def _sample_entries(batch: SampleBatch) -> list[tuple[str, Any]]:
    return [
        ("keys", batch.keys),
        ("priorities", batch.priorities),
        ("probabilities", batch.probabilities),
        ("weights", batch.weights),
        ("times_sampled", batch.times_sampled),
        ("columns", batch.columns or {}),
    ]


def _item_entries(found: FoundColumns) -> list[tuple[str, Any]]:
    return [
        ("keys", found.keys),
        ("priorities", found.priorities),
        ("times_sampled", found.times_sampled),
        ("columns", found.columns),
        ("missing", found.missing),
    ]


# --- JSON --------------------------------------------------------------------------------------


def _ndarray_form(column: Column) -> dict[str, Any]:
    data = base64.b64encode(column.contiguous()).decode("ascii")
    return {"$ndarray": {"dtype": column.dtype, "shape": list(column.shape), "data": data}}


def _json(entries: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in entries:
        if isinstance(value, list | int | float):
            out[name] = value
        elif isinstance(value, dict):
            out[name] = {field: _ndarray_form(column) for field, column in value.items()}
        else:
            out[name] = _ndarray_form(Column.of(value))
    return out


def sample_columns_json(batch: SampleBatch) -> dict[str, Any]:
    """The JSON answer of a sample with ``layout: "columns"``, as a JSON-able dict."""
    return _json(_sample_entries(batch))


def item_columns_json(found: FoundColumns) -> dict[str, Any]:
    """The JSON answer of a batchGet with ``layout: "columns"``, as a JSON-able dict."""
    return _json(_item_entries(found))


def window_columns_msgpack(entries: Sequence[tuple[str, Any]]) -> memoryview | AnswerPieces:
    """The msgpack answer of an episode table's sample: ``entries`` are (name, value) with
    a value a list of strings, a number, an array, or a map of :class:`Column` (see
    :mod:`rlreplay.app.api.window_answers`). Arrays of :data:`WINDOWS_AS_THEY_LIE` bytes or
    more go out where the window build wrote them (buffers it reuses only once nothing,
    the transport included, holds them)."""
    return _entries(entries, lie_bytes=WINDOWS_AS_THEY_LIE)


def window_columns_json(entries: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """The JSON answer of an episode table's sample, as a JSON-able dict."""
    return _json(entries)
