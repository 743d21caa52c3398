"""The wire codec: msgpack with n-dimensional arrays, and the contract's JSON form.

Msgpack (:func:`packb`, :func:`unpackb`):

* NumPy arrays and torch tensors travel as extension type :data:`EXT_NDARRAY` (see
  :mod:`rlreplay.wire.arrays` for the payload); they decode to NumPy arrays (bfloat16 to
  :class:`~rlreplay.wire.arrays.BFloat16Array`), bit-exactly and with the same dtype and shape.
  Encoding lays maps and arrays out by hand (:mod:`rlreplay.wire.packing`).
* NumPy scalars become Python scalars (``np.float32(0.5)`` → ``0.5``, ``np.bool_`` → ``bool``);
  those with no Python msgpack type (complex, long double, datetime64) become 0-d arrays.
* Tuples become lists; maps may have ``str``, ``bytes``, ``int``, ``float``, ``bool`` or
  ``None`` keys, and an array as a map key decodes as a tuple (a map as a key is refused).
  The msgpack timestamp (extension type -1) decodes to a UTC ``datetime``; any other
  extension type is refused when decoding.
* Decoding uses msgspec, faster than msgpack on a sampled batch, whose maps dominate the
  work (docs/benchmarks.md, "One Python client"); what msgspec refuses, msgpack decodes or
  explains, with the same result.

The JSON form (:func:`to_jsonable`, :func:`from_jsonable`) is the reversible JSON rendering of
any value the msgpack form can hold:

* bytes → ``{"$bytes": "<base64>"}``
* arrays → ``{"$ndarray": {"dtype": "<f4", "shape": [2, 3], "data": "<base64>"}}``
* the floats JSON cannot spell → ``{"$float": "NaN"}``, ``{"$float": "Infinity"}`` and
  ``{"$float": "-Infinity"}``; finite floats stay numbers.
* maps whose keys are all strings stay JSON objects. A map with any other key, or a map that
  could be mistaken for a tag (exactly one key, which is ``"$bytes"``, ``"$ndarray"``,
  ``"$float"`` or ``"$map"``), becomes ``{"$map": [[key, value], ...]}``, keys and values in
  JSON form.

:func:`jsonable_to_msgpack` and :func:`msgpack_to_jsonable` convert between the two forms
directly, without building NumPy arrays, for a server that stores msgpack and answers JSON;
:func:`msgpack_to_jsonable` leaves non-finite floats to :func:`spell_floats` (see there).
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable
from typing import Any

import msgpack
import msgspec
import numpy as np

from rlreplay.wire.arrays import (
    EXT_NDARRAY,
    BFloat16Array,
    decode_array,
    decode_ext,
    parse_payload,
    payload_from_parts,
)
from rlreplay.wire.packing import encode_default, packb

__all__ = [
    "EXT_NDARRAY",
    "BFloat16Array",
    "from_jsonable",
    "jsonable_to_msgpack",
    "msgpack_to_jsonable",
    "packb",
    "spell_floats",
    "to_jsonable",
    "unpackb",
]

_BYTES, _NDARRAY, _FLOAT, _MAP = "$bytes", "$ndarray", "$float", "$map"
_TAGS = frozenset({_BYTES, _NDARRAY, _FLOAT, _MAP})
#: The ``$float`` spellings, as JavaScript's ``String(x)`` and Python's ``json`` write them.
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_JSON_SCALARS = (bool, int, float, str)


# --- msgpack -------------------------------------------------------------------------------


_ext_hook = decode_ext


_DECODE_ERRORS = (ValueError, TypeError, msgpack.UnpackException)

_FAST_DECODER = msgspec.msgpack.Decoder(ext_hook=_ext_hook)
_FAST_ERRORS = (
    msgspec.DecodeError,
    ValueError,
    TypeError,
    RecursionError,
    OverflowError,  # a timestamp past datetime's range
)


def _lists_except_keys(obj: Any) -> Any:
    """``obj`` decoded with ``use_list=False``, its arrays made lists again except in keys."""
    if isinstance(obj, tuple):
        return [_lists_except_keys(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _lists_except_keys(v) for k, v in obj.items()}
    return obj


def _unpack_with_msgpack(data: bytes | bytearray | memoryview) -> Any:
    options: dict[str, Any] = {
        "ext_hook": _ext_hook,
        "raw": False,
        "strict_map_key": False,
        "timestamp": 3,  # datetime, as msgspec
    }
    try:
        return msgpack.unpackb(data, use_list=True, **options)
    except TypeError as exc:
        if "unhashable type: 'list'" not in str(exc):
            raise
    # an array as a map key (rare): tuples, as msgspec decodes them
    return _lists_except_keys(msgpack.unpackb(data, use_list=False, **options))


def unpackb(data: bytes | bytearray | memoryview) -> Any:
    """Decode msgpack bytes; extension type 1 becomes a NumPy array.

    Arrays come back writable and C-contiguous, with the dtype (byte order included) and
    shape they were sent with. bfloat16 arrays come back as :class:`BFloat16Array`
    (``.to_torch()`` gives the tensor) since NumPy has no bfloat16 dtype of its own.

    Args:
        data: One complete msgpack value.

    Returns:
        The decoded value.

    Raises:
        ValueError: The input is not one well-formed msgpack value (truncated, trailing
            bytes, invalid UTF-8, a map as a map key), or holds a malformed array payload
            or an unknown extension type.
    """
    try:
        return _FAST_DECODER.decode(data)
    except _FAST_ERRORS:
        pass  # refused: msgpack says why (or, on a difference, decides)
    try:
        return _unpack_with_msgpack(data)
    except (*_DECODE_ERRORS, RecursionError, OverflowError) as exc:
        raise ValueError(f"malformed msgpack: {exc}") from exc


# --- JSON form -----------------------------------------------------------------------------


def _b64(data: Any) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise ValueError("base64 data must be a string")
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"invalid base64: {exc}") from exc


def _ndarray_form(payload: bytes | memoryview) -> dict[str, Any]:
    dtype, shape, data = parse_payload(payload)
    return {_NDARRAY: {"dtype": dtype, "shape": shape, "data": _b64(data)}}


def _float_form(number: float) -> dict[str, str]:
    """``{"$float": ...}`` of a NaN or an infinity."""
    if math.isnan(number):
        return {_FLOAT: "NaN"}
    return {_FLOAT: "Infinity" if number > 0 else "-Infinity"}


def spell_floats(form: Any) -> Any:
    """``form`` with each NaN and infinity replaced by its ``{"$float": ...}`` tag.

    :func:`msgpack_to_jsonable` leaves these floats as they are, so that the common value
    pays no check for them: a JSON encoder that refuses them (``json.dumps`` with
    ``allow_nan=False``) tells when a form needs this walk. Finite floats, the other leaves
    and the tags already in ``form`` are kept; dicts and lists are copied (tuples become
    lists).

    Args:
        form: A JSON form (dicts with string keys, lists, scalars), or any JSON-able data
            that holds such forms.

    Returns:
        The form with no float that JSON cannot spell.
    """
    if isinstance(form, float):
        return form if math.isfinite(form) else _float_form(form)
    if isinstance(form, dict):
        return {key: spell_floats(value) for key, value in form.items()}
    if isinstance(form, list | tuple):
        return [spell_floats(item) for item in form]
    return form


def _map_form(obj: dict[Any, Any], convert: Callable[[Any], Any]) -> dict[str, Any]:
    tag_like = len(obj) == 1 and next(iter(obj)) in _TAGS
    if not tag_like and all(isinstance(key, str) for key in obj):
        return {key: convert(value) for key, value in obj.items()}
    return {_MAP: [[convert(key), convert(value)] for key, value in obj.items()]}


def to_jsonable(obj: Any) -> Any:
    """The contract's reversible JSON form of a value (see the module docstring).

    Args:
        obj: Anything :func:`packb` accepts.

    Returns:
        A value made of dicts with string keys, lists, strings, numbers, booleans and None.

    Raises:
        TypeError: A value has no wire form.
    """
    if type(obj) is float:
        return obj if math.isfinite(obj) else _float_form(obj)
    if obj is None or type(obj) in _JSON_SCALARS:
        return obj
    if isinstance(obj, bytes | bytearray | memoryview):
        return {_BYTES: _b64(obj)}
    if isinstance(obj, dict):
        return _map_form(obj, to_jsonable)
    if isinstance(obj, list | tuple):
        return [to_jsonable(item) for item in obj]
    for scalar_type in _JSON_SCALARS:  # subclasses: enums, np.float64, np.str_
        if isinstance(obj, scalar_type) and not isinstance(obj, np.generic):
            return to_jsonable(scalar_type(obj))
    encoded = encode_default(obj)
    if isinstance(encoded, msgpack.ExtType):
        return _ndarray_form(encoded.data)
    return to_jsonable(encoded)


def _tag(obj: dict[str, Any]) -> str | None:
    if len(obj) == 1:
        (key,) = obj
        if key in _TAGS:
            return key
    return None


def _pairs(value: Any) -> list[list[Any]]:
    if not isinstance(value, list) or not all(
        isinstance(pair, list) and len(pair) == 2 for pair in value
    ):
        raise ValueError('"$map" must be a list of [key, value] pairs')
    return value


def _ndarray_parts(value: Any) -> tuple[str, list[int], bytes]:
    if not isinstance(value, dict) or set(value) != {"dtype", "shape", "data"}:
        raise ValueError('"$ndarray" must be {"dtype", "shape", "data"}')
    payload = payload_from_parts(value["dtype"], value["shape"], _unb64(value["data"]))
    dtype, shape, data = parse_payload(payload)  # validates, normalises the dtype
    return dtype, shape, data


def from_jsonable(obj: Any) -> Any:
    """Turn the JSON form back into the value: ``$bytes`` to bytes, ``$ndarray`` to arrays,
    ``$float`` to floats.

    Args:
        obj: A value in JSON form, as parsed by ``json.loads``.

    Returns:
        The value, with NumPy arrays (bfloat16 ones as :class:`BFloat16Array`).

    Raises:
        ValueError: A tag is malformed (bad base64, inconsistent array, a ``$float`` other
            than ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``) or a ``$map`` key is
            unhashable.
    """
    return _untag(obj, decode_array)


def _wire_array(payload: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_NDARRAY, payload)


def _nonfinite(name: Any) -> float:
    if not isinstance(name, str) or name not in _NONFINITE:
        raise ValueError('"$float" must be "NaN", "Infinity" or "-Infinity"')
    return _NONFINITE[name]


def _untag(obj: Any, array: Callable[[bytes], Any]) -> Any:
    """The JSON form with its tags replaced: ``$bytes`` by bytes, ``$float`` by a float,
    ``$map`` by a map, and ``$ndarray`` by ``array(payload)`` (a NumPy array, or the msgpack
    extension as is)."""
    if isinstance(obj, list):
        return [_untag(item, array) for item in obj]
    if not isinstance(obj, dict):
        return obj
    tag = _tag(obj)
    if tag == _BYTES:
        return _unb64(obj[_BYTES])
    if tag == _FLOAT:
        return _nonfinite(obj[_FLOAT])
    if tag == _NDARRAY:
        dtype, shape, data = _ndarray_parts(obj[_NDARRAY])
        return array(payload_from_parts(dtype, shape, data))
    if tag == _MAP:
        try:
            return {_untag(k, array): _untag(v, array) for k, v in _pairs(obj[_MAP])}
        except TypeError as exc:
            raise ValueError(f"unhashable map key: {exc}") from exc
    return {key: _untag(value, array) for key, value in obj.items()}


def jsonable_to_msgpack(obj: Any) -> bytes:
    """The msgpack bytes of a value given in JSON form (arrays as extension type 1).

    Array tags are validated (base64, dtype, length against the shape) and their dtype is
    normalised to carry its byte order, but no NumPy array is built.

    Raises:
        ValueError: A tag is malformed.
        TypeError: ``obj`` holds something that is not JSON.
    """
    try:
        packed: bytes = msgpack.packb(_untag(obj, _wire_array), use_bin_type=True, datetime=False)
    except OverflowError as exc:
        raise ValueError(f"cannot encode: {exc}") from exc
    return packed


def _wire_to_jsonable(obj: Any) -> Any:
    if isinstance(obj, _NdarrayForm):
        return obj.form
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, bytes):
        return {_BYTES: _b64(obj)}
    if isinstance(obj, list):
        return [_wire_to_jsonable(item) for item in obj]
    if isinstance(obj, dict):
        return _map_form(obj, _wire_to_jsonable)
    raise ValueError(f"no JSON form for msgpack value of type {type(obj).__qualname__}")


class _NdarrayForm:
    """An ext-1 value already rendered as its ``$ndarray`` JSON form."""

    __slots__ = ("form",)

    def __init__(self, payload: bytes) -> None:
        self.form = _ndarray_form(payload)


def _json_ext_hook(code: int, payload: bytes) -> Any:
    if code != EXT_NDARRAY:
        raise ValueError(f"unknown msgpack extension type {code}")
    return _NdarrayForm(payload)


def msgpack_to_jsonable(data: bytes | bytearray | memoryview) -> Any:
    """The JSON form of msgpack bytes (as the server stores values).

    Extension type 1 becomes ``{"$ndarray": ...}`` and ``bin`` becomes ``{"$bytes": ...}``,
    without building NumPy arrays. NaN and infinities (float64, float32) are left as
    floats: :func:`spell_floats` completes the form when a JSON encoder refuses them.

    Raises:
        ValueError: The bytes are not one well-formed msgpack value, or hold a malformed
            array, an unknown extension type or a value with no JSON form (a timestamp).
    """
    try:
        value = msgpack.unpackb(
            data, ext_hook=_json_ext_hook, raw=False, strict_map_key=False, use_list=True
        )
    except _DECODE_ERRORS as exc:
        raise ValueError(f"malformed msgpack: {exc}") from exc
    return _wire_to_jsonable(value)
