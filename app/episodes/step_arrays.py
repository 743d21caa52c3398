"""Step arrays as they travel: a ``steps`` map (field -> array, first axis the steps) read
from a request or a log record, and arrays packed for an answer or the log.

In msgpack an array is extension type 1, read where it lies (no copy until stored); a plain
list or scalar is taken as NumPy makes it. bfloat16 arrays are held as ``<u2`` with their
wire dtype kept beside them (``dtypes``), so they go back out as ``"bfloat16"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from rlreplay.wire.arrays import (
    BFLOAT16,
    EXT_NDARRAY,
    BFloat16Array,
    payload_from_parts,
    split_payload,
    wire_dtype,
)
from rlreplay.wire.codec import unpackb
from rlreplay.wire.errors import BadRequest, ValidationFailed

__all__ = ["StepArrays", "array_value", "pack_steps", "steps_from_msgpack", "steps_from_values"]

#: Field -> array, and field -> wire dtype where it is not the array's own (bfloat16).
StepArrays = tuple[dict[str, np.ndarray], dict[str, str]]


def array_value(value: Any, where: str) -> tuple[np.ndarray, str | None]:
    """A decoded value as an array, and its wire dtype when the array does not say it.

    Raises:
        ValidationFailed: Not an array, a list or a number.
    """
    if isinstance(value, BFloat16Array):
        return value.bits.astype("<u2", copy=False), BFLOAT16
    if isinstance(value, np.ndarray):
        return value, None
    if isinstance(value, bool | int | float | list):
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise ValidationFailed(f"{where}: {exc}") from exc
        if array.dtype.kind not in "biuf":
            raise ValidationFailed(f"{where} is not an array of numbers")
        return array, None
    raise ValidationFailed(f"{where} must be an array, not {type(value).__name__}")


def steps_from_values(values: Mapping[Any, Any]) -> StepArrays:
    """The arrays of a decoded ``steps`` map (JSON's ``$ndarray`` forms already arrays).

    Raises:
        ValidationFailed: A name that is not a string, or a value that is not an array.
    """
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for name, value in values.items():
        if not isinstance(name, str) or not name:
            raise ValidationFailed(f"steps: the field name {name!r} is not a string")
        array, dtype = array_value(value, f"steps[{name!r}]")
        arrays[name] = array
        if dtype is not None:
            dtypes[name] = dtype
    return arrays, dtypes


def steps_from_msgpack(raw: bytes | memoryview) -> StepArrays:
    """The arrays of a msgpack ``steps`` map; ext-1 arrays are read where they lie.

    Raises:
        BadRequest: Not a map, or a malformed array.
        ValidationFailed: As :func:`steps_from_values`.
    """
    try:
        named = msgpack.unpackb(raw, raw=False, ext_hook=_Ext, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise BadRequest(f"steps: malformed msgpack ({exc})") from exc
    if not isinstance(named, dict):
        raise BadRequest("steps must be a map of field name to array")
    values: dict[Any, Any] = {}
    for name, value in named.items():
        if isinstance(value, _Ext):
            if value.code != EXT_NDARRAY:
                raise BadRequest(f"steps[{name!r}]: unknown msgpack extension type {value.code}")
            try:
                dtype, shape, data = split_payload(value.data)
            except ValueError as exc:
                raise BadRequest(f"steps[{name!r}]: {exc}") from exc
            if dtype == BFLOAT16:
                bits = np.frombuffer(data, dtype="<u2").reshape(shape)
                values[name] = BFloat16Array(bits.astype(np.uint16))
            else:
                values[name] = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
        else:
            values[name] = _plain(value)
    return steps_from_values(values)


class _Ext:
    """A msgpack extension, kept unread (its payload a view of the body)."""

    __slots__ = ("code", "data")

    def __init__(self, code: int, data: bytes) -> None:
        self.code, self.data = code, data


def _plain(value: Any) -> Any:
    if isinstance(value, list) and any(isinstance(v, _Ext | list) for v in value):
        packed = msgpack.packb([_repacked(v) for v in value])
        return unpackb(packed)
    return value


def _repacked(value: Any) -> Any:
    if isinstance(value, _Ext):
        return msgpack.ExtType(value.code, value.data)
    if isinstance(value, list):
        return [_repacked(v) for v in value]
    return value


def ext_of(array: np.ndarray, dtype: str | None = None) -> msgpack.ExtType:
    """``array`` as msgpack extension type 1 (``dtype``: its wire dtype, when not the
    array's own)."""
    array = np.ascontiguousarray(array)
    wire = dtype or wire_dtype(array.dtype)
    return msgpack.ExtType(EXT_NDARRAY, payload_from_parts(wire, list(array.shape), array))


def pack_steps(arrays: Mapping[str, np.ndarray], dtypes: Mapping[str, str]) -> bytes:
    """The msgpack ``steps`` map of ``arrays`` (what :func:`steps_from_msgpack` reads)."""
    packed: bytes = msgpack.packb(
        {name: ext_of(array, dtypes.get(name)) for name, array in arrays.items()}
    )
    return packed
