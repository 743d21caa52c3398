"""The codec's msgpack encoder: maps and arrays laid out by hand, the rest by msgpack-python.

An item's value is nearly always a map of arrays and scalars. :func:`packb` writes such
values itself: map headers, keys (their encodings cached), floats, small ints, ``None`` and
booleans directly, and each array as its cached extension header followed by a view of its
memory (:func:`~rlreplay.wire.arrays.append_array`), so that an array costs a lookup and
the one copy into the message. Lists and tuples that start with an array or a map are
walked the same way. Any other value (strings, bytes, long lists of numbers, subclasses,
maps nested deeper than :data:`_MAX_DEPTH`) is packed by msgpack-python, whose ``default``
hook encodes the arrays it meets; both paths write the same bytes for the same value.

The commonest values of all, maps of strings to arrays, plain scalars and more such maps
and lists (a push body holds a list of them), go to msgspec's encoder instead, which walks
them in C and calls back only for the arrays; it writes the same bytes again. Each array is
then one lookup of its header and one join with its memory (:func:`array_ext`).
"""

from __future__ import annotations

from typing import Any, Final

import msgpack
import msgspec
import numpy as np

from rlreplay.wire.arrays import (
    _HEADS,
    EXT_NDARRAY,
    BFloat16Array,
    append_array,
    append_bfloat16,
    append_tensor,
    array_payload,
    bfloat16_payload,
    tensor_to_wire,
    torch_tensor_type,
    zero_padding,
)
from rlreplay.wire.headers import array_header, float_bytes, int_bytes, map_header, str_bytes
from rlreplay.wire.pieces import Pieces

__all__ = ["array_ext", "encode_default", "is_plain", "pack_pieces", "packb"]

_PYTHON_SCALARS = (bool, int, float, str, bytes)
#: Maps and lists nested deeper than this are handed to msgpack-python as a whole.
_MAX_DEPTH: Final = 32
_KEYS: dict[str, bytes] = {}
_KEYS_LIMIT: Final = 4096
_SMALL_INTS: Final = tuple(int_bytes(n) for n in range(128))
_CONSTANTS: Final = {None: b"\xc0", True: b"\xc3", False: b"\xc2"}


def _scalar_or_array(value: np.generic) -> Any:
    """A NumPy scalar as its Python scalar, or as a 0-d array when it has none."""
    python_value = value.item()
    if isinstance(python_value, _PYTHON_SCALARS):
        return python_value
    return msgpack.ExtType(EXT_NDARRAY, array_payload(zero_padding(np.array(value))))


def encode_default(obj: Any) -> Any:
    """msgpack's hook for the types it does not know: arrays, NumPy scalars, tensors.

    Raises:
        TypeError: ``obj`` has no wire form.
        ValueError: An int that does not fit in 64 bits.
    """
    if isinstance(obj, np.ndarray):
        return msgpack.ExtType(EXT_NDARRAY, array_payload(obj))
    if isinstance(obj, np.generic):
        return _scalar_or_array(obj)
    if isinstance(obj, BFloat16Array):
        return msgpack.ExtType(EXT_NDARRAY, bfloat16_payload(obj))
    tensor_type = torch_tensor_type()
    if tensor_type is not None and isinstance(obj, tensor_type):
        return msgpack.ExtType(EXT_NDARRAY, tensor_to_wire(obj))
    if isinstance(obj, int):  # msgpack hands over the ints it cannot fit
        raise ValueError(f"int {obj} does not fit in 64 bits")
    raise TypeError(f"cannot encode an object of type {type(obj).__qualname__}")


def _by_msgpack(obj: Any) -> bytes:
    try:
        packed: bytes = msgpack.packb(
            obj, default=encode_default, use_bin_type=True, datetime=False
        )
    except OverflowError as exc:
        raise ValueError(f"cannot encode: {exc}") from exc
    return packed


def _key(key: Any) -> bytes:
    if type(key) is not str:
        return _by_msgpack(key)
    encoded = str_bytes(key)
    if len(_KEYS) >= _KEYS_LIMIT:
        _KEYS.clear()
    _KEYS[key] = encoded
    return encoded


def _append(obj: Any, parts: list[Any], depth: int) -> None:
    """Append the encoding of ``obj`` to ``parts``."""
    kind = type(obj)
    if kind is np.ndarray:
        append_array(obj, parts)
    elif kind is float:
        parts.append(float_bytes(obj))
    elif kind is dict and depth < _MAX_DEPTH:
        parts.append(map_header(len(obj)))
        keys = _KEYS
        for key, value in obj.items():
            encoded = keys.get(key) if type(key) is str else None
            parts.append(_key(key) if encoded is None else encoded)
            if type(value) is np.ndarray:  # the common value, without a call of its own
                head = _HEADS.get((value.dtype, value.shape))
                if head is not None and value.flags.c_contiguous:
                    parts.append(head)
                    parts.append(value)  # joined through the buffer protocol: no view object
                    continue
            _append(value, parts, depth + 1)
    elif kind is str:
        parts.append(str_bytes(obj))
    elif kind is int and 0 <= obj < 128:
        parts.append(_SMALL_INTS[obj])
    elif kind is bool or obj is None:
        parts.append(_CONSTANTS[obj])
    elif (
        (kind is list or kind is tuple)
        and depth < _MAX_DEPTH
        and obj
        and type(obj[0]) in (np.ndarray, dict)
    ):
        parts.append(array_header(len(obj)))
        for item in obj:
            _append(item, parts, depth + 1)
    else:
        _append_other(obj, parts)


def _append_other(obj: Any, parts: list[Any]) -> None:
    if isinstance(obj, np.generic):  # as _scalar_or_array
        value = obj.item()
        if isinstance(value, _PYTHON_SCALARS):
            _append(value, parts, _MAX_DEPTH)
        else:
            append_array(zero_padding(np.array(obj)), parts)
        return
    if isinstance(obj, BFloat16Array):
        append_bfloat16(obj, parts)
        return
    tensor_type = torch_tensor_type()
    if tensor_type is not None and isinstance(obj, tensor_type):
        append_tensor(obj, parts)
        return
    parts.append(_by_msgpack(obj))


#: Value types msgspec encodes exactly as msgpack-python does (arrays through the hook).
_PLAIN_LEAVES: Final = frozenset({np.ndarray, float, int, str, bool, bytes, type(None)})


def array_ext(array: np.ndarray[Any, Any]) -> msgspec.Raw:
    """A NumPy array's whole ext-1 encoding, spliced in by msgspec: the hook for the one type
    a value :func:`is_plain` accepts holds that msgspec does not encode itself.

    A layout seen before costs one lookup and one join: joining refuses (``TypeError``) an
    array whose memory is not C-contiguous, which then takes the general path, as does a
    layout not cached yet.
    """
    try:
        pieces: tuple[Any, ...] = (_HEADS[array.dtype, array.shape], array)  # both buffers
        return msgspec.Raw(b"".join(pieces))
    except (KeyError, TypeError):
        parts: list[Any] = []
        append_array(array, parts)
        return msgspec.Raw(b"".join(parts))


_PLAIN_ENCODER: Final = msgspec.msgpack.Encoder(enc_hook=array_ext)


def is_plain(obj: Any) -> bool:
    """Whether ``obj`` holds only maps with str keys, lists, tuples, arrays and plain scalars,
    nested at most :data:`_MAX_DEPTH` deep: the usual value (or list of values), which msgspec
    encodes in C with the bytes the hand-laid path writes (calling back for arrays only)."""
    leaves = _PLAIN_LEAVES
    level: list[Any] = [obj]
    for _ in range(_MAX_DEPTH + 1):
        inner: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is dict:
                for key, value in item.items():
                    if type(key) is not str:
                        return False
                    if type(value) not in leaves:
                        inner.append(value)
            elif kind is list or kind is tuple:
                inner.extend(value for value in item if type(value) not in leaves)
            elif kind not in leaves:
                return False
        if not inner:
            return True
        level = inner
    return False


def packb(obj: Any) -> bytes:
    """Encode a value as msgpack, arrays and tensors as extension type 1.

    Args:
        obj: Maps, lists, tuples, strings, bytes, numbers, booleans, None, NumPy arrays and
            scalars, torch tensors and :class:`BFloat16Array`, nested freely.

    Returns:
        The msgpack bytes.

    Raises:
        TypeError: A value has no msgpack form (a set, an object array, a float8 tensor...).
        ValueError: The value is too deep or too large for msgpack, or an int does not fit
            in 64 bits.
    """
    if is_plain(obj):
        try:
            return _PLAIN_ENCODER.encode(obj)
        except OverflowError:  # an int past 64 bits: the hand-laid path says which
            pass
    parts: list[Any] = []
    _append(obj, parts, 0)
    return parts[0] if len(parts) == 1 and type(parts[0]) is bytes else b"".join(parts)


def pack_pieces(obj: Any) -> Pieces:
    """:func:`packb`'s bytes, not joined: each long array a view of its own memory (which
    must not change until the pieces are sent).

    Raises:
        TypeError, ValueError: As :func:`packb`.
    """
    parts: list[Any] = []
    _append(obj, parts, 0)
    return Pieces(parts)
