"""Answers of sample and batchGet with ``layout: "columns"``, in msgpack or JSON.

``{"keys", "priorities", "probabilities", "weights", "times_sampled", "columns"}`` for a
sample, ``{"keys", "priorities", "times_sampled", "columns", "missing"}`` for a batchGet
(:class:`~rlreplay.wire.schemas.SampleColumns`, :class:`~rlreplay.wire.schemas.ItemColumns`).
The columns come from :func:`~rlreplay.app.tables.stacking.stack_values`. In msgpack every
array is extension type 1, laid out here around the stacked data; in JSON the contract's
``{"$ndarray": {"dtype", "shape", "data"}}`` form.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt

from rlreplay.app.tables.items import ItemBatch, SampleBatch
from rlreplay.app.tables.stacking import Column, stack_values
from rlreplay.wire.arrays import array_head
from rlreplay.wire.headers import map_header, str_bytes

__all__ = [
    "FoundColumns",
    "item_columns_json",
    "item_columns_msgpack",
    "sample_columns_json",
    "sample_columns_msgpack",
]


class FoundColumns:
    """The items a batchGet found, stacked, and the keys it did not find."""

    __slots__ = ("columns", "keys", "missing", "priorities", "times_sampled")

    def __init__(self, batch: ItemBatch) -> None:
        """Stacks the values found in ``batch``.

        Raises:
            ValidationFailed: They do not stack (the message names the field).
        """
        found = [i for i, value in enumerate(batch.values) if value is not None]
        index = np.asarray(found, dtype=np.int64)
        self.keys = [batch.keys[i] for i in found]
        pairs = zip(batch.keys, batch.values, strict=True)
        self.missing = [key for key, value in pairs if value is None]
        self.priorities: npt.NDArray[np.float64] = batch.priorities[index]
        self.times_sampled: npt.NDArray[np.int64] = batch.times_sampled[index]
        values: list[bytes] = [batch.values[i] for i in found]  # type: ignore[misc]
        self.columns = stack_values(self.keys, values)


# --- msgpack -----------------------------------------------------------------------------------

_LISTS: Final = msgspec.msgpack.Encoder()


def _entries(entries: Sequence[tuple[str, Any]]) -> memoryview:
    """A msgpack map of lists of strings, arrays and maps of columns, laid out by hand.

    The answer is written into one buffer: each column's data is copied once, straight
    from where stacking left it (often a strided view of the values), and everything
    between two columns is joined into one piece first.
    """
    pieces: list[Any] = []  # bytes, and the columns' data
    small: list[bytes] = [map_header(len(entries))]

    def array(column: Column) -> None:
        small.append(array_head(column.dtype, column.shape, column.nbytes))
        pieces.append(b"".join(small))
        small.clear()
        pieces.append(column.data)

    for name, value in entries:
        small.append(str_bytes(name))
        if isinstance(value, list):
            small.append(_LISTS.encode(value))  # strings, in C
        elif isinstance(value, dict):
            small.append(map_header(len(value)))
            for field, column in value.items():
                small.append(str_bytes(field))
                array(column)
        else:
            array(Column.of(value))
    pieces.append(b"".join(small))
    sizes = [memoryview(piece).nbytes for piece in pieces]
    out = np.empty(sum(sizes), dtype=np.uint8)
    pos = 0
    for piece, size in zip(pieces, sizes, strict=True):
        if size:
            target = out[pos : pos + size]
            if type(piece) is np.ndarray:
                if piece.dtype != np.uint8:  # a column of numbers: its bytes
                    piece = np.ascontiguousarray(piece).reshape(-1).view(np.uint8)
                target.reshape(piece.shape)[...] = piece  # a strided view: the gather
            else:
                target[...] = np.frombuffer(piece, dtype=np.uint8)
        pos += size
    return out.data


def sample_columns_msgpack(batch: SampleBatch) -> memoryview:
    """The msgpack answer of a sample with ``layout: "columns"`` (its ``columns`` set)."""
    return _entries(_sample_entries(batch))


def item_columns_msgpack(found: FoundColumns) -> memoryview:
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
        if isinstance(value, list):
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
