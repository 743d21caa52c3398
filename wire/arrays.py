"""N-dimensional arrays on the wire: the payload of msgpack extension type 1.

The payload is the msgpack array ``[dtype, shape, data]``:

* ``dtype``: a NumPy dtype string with its byte order, exactly as ``ndarray.dtype.str``
  writes it (``"<f4"``, ``"|u1"``, ``"<i8"``, ``"|b1"``, ``">f8"`` for big-endian input),
  or ``"bfloat16"`` for bfloat16 (two bytes per element, little-endian).
* ``shape``: a list of non-negative ints (``[]`` for a 0-d array).
* ``data``: msgpack ``bin``, the C-contiguous element bytes, ``prod(shape) * itemsize`` long.

Arrays keep their byte order: a big-endian array comes back big-endian, with the very same
bytes, so every round trip is bit-exact (NaN payloads and ``-0.0`` included).

bfloat16 has no NumPy dtype without ``ml_dtypes``, which the client does not require. A
bfloat16 payload therefore decodes to :class:`BFloat16Array`, a small holder of the raw bits
that packs back as ``"bfloat16"`` and converts losslessly with :meth:`BFloat16Array.to_torch`
or :meth:`BFloat16Array.to_float32`. NumPy arrays whose dtype is named ``bfloat16``
(``ml_dtypes.bfloat16``) and ``torch.bfloat16`` tensors are encoded as ``"bfloat16"`` too.

Encoding lays the extension out by hand (:func:`append_array`): the header of an array's
dtype and shape is built once and cached, and the data goes out as a view of the array's
memory, so an array costs a dictionary lookup and the copy into the message. Decoding reads
the payload with one msgspec call and makes the array over a single copy of the data.

Torch is never imported here: a tensor can only be handed over if torch is already imported,
so :func:`torch_tensor_type` looks it up in ``sys.modules``.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final

import msgspec
import numpy as np

from rlreplay.wire.headers import array_header, bin_header, ext_header, int_bytes, str_bytes

if TYPE_CHECKING:
    import torch

__all__ = [
    "BFLOAT16",
    "EXT_NDARRAY",
    "BFloat16Array",
    "append_array",
    "append_bfloat16",
    "append_tensor",
    "array_head",
    "array_payload",
    "bfloat16_payload",
    "decode_array",
    "decode_ext",
    "dtype_info",
    "parse_payload",
    "payload_from_parts",
    "payload_header",
    "split_payload",
    "tensor_to_wire",
    "torch_tensor_type",
    "wire_dtype",
    "zero_padding",
]

EXT_NDARRAY = 1
"""The msgpack extension type code of an n-dimensional array."""

BFLOAT16 = "bfloat16"
"""The dtype string of bfloat16 arrays on the wire."""

_ALLOWED_KINDS = frozenset("biufcSUVmM")
_MAX_NDIM = 64


@dataclass(frozen=True, eq=False)
class BFloat16Array:
    """A bfloat16 array held as its raw bits, for environments without a bfloat16 dtype.

    Attributes:
        bits: The raw bfloat16 values as a C-contiguous ``uint16`` array (native byte order)
            with the array's shape; bfloat16 is the upper half of an IEEE float32.
    """

    bits: np.ndarray[Any, np.dtype[np.uint16]]

    def __post_init__(self) -> None:
        if self.bits.dtype != np.dtype(np.uint16):
            raise TypeError(f"BFloat16Array bits must be uint16, not {self.bits.dtype}")

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return tuple(self.bits.shape)

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return self.bits.ndim

    @property
    def dtype(self) -> str:
        """``"bfloat16"``, the wire dtype string (NumPy has no bfloat16 dtype to give)."""
        return BFLOAT16

    def to_float32(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        """The values as float32; exact, since every bfloat16 is a float32."""
        widened = self.bits.astype(np.uint32)
        widened <<= 16  # in place: a 0-d array stays an array (an operator gives a scalar)
        return widened.view(np.float32)

    def to_torch(self) -> torch.Tensor:
        """The values as a ``torch.bfloat16`` tensor with the same bits (imports torch).

        The tensor shares the memory of :attr:`bits` when they are C-contiguous and writable.
        """
        import torch

        bits = self.bits
        if not (bits.flags.c_contiguous and bits.flags.writeable):
            bits = bits.copy(order="C")
        return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)

    def __len__(self) -> int:
        """The length of the first axis (a 0-d array has none, as in NumPy)."""
        return len(self.bits)

    def __getitem__(self, index: Any) -> BFloat16Array:
        """``x[i]``, ``x[2:5]``...: the bfloat16 values NumPy's indexing picks, as a
        :class:`BFloat16Array` (a single value is a 0-d one), their bits copied C-contiguous.
        Rows of a column (a :class:`~rlreplay.clients.columns.ColumnBatch`'s) come this way."""
        return BFloat16Array(np.array(self.bits[index], order="C"))

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        """``np.asarray(x)`` gives the float32 values (exact)."""
        values = self.to_float32()
        return values if dtype is None else values.astype(dtype)

    def __eq__(self, other: object) -> bool:
        """Bitwise equality with another :class:`BFloat16Array`."""
        if not isinstance(other, BFloat16Array):
            return NotImplemented
        return self.bits.shape == other.bits.shape and bool(np.array_equal(self.bits, other.bits))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"BFloat16Array(shape={self.shape}, values={self.to_float32()!r})"


def torch_tensor_type() -> type[Any] | None:
    """``torch.Tensor`` when torch has been imported by someone, else None (never imports)."""
    torch_module = sys.modules.get("torch")
    tensor = getattr(torch_module, "Tensor", None)
    return tensor if isinstance(tensor, type) else None


@functools.lru_cache(maxsize=256)
def wire_dtype(dtype: np.dtype[Any]) -> str:
    """The wire dtype string of a NumPy dtype.

    Args:
        dtype: The array's dtype.

    Returns:
        ``dtype.str`` (with byte order) or ``"bfloat16"``.

    Raises:
        TypeError: The dtype cannot travel: object, structured or variable-width string
            dtypes, or zero-size elements.
    """
    if dtype.name == BFLOAT16 and dtype.itemsize == 2:
        return BFLOAT16
    if dtype.kind not in _ALLOWED_KINDS or dtype.fields is not None or dtype.itemsize == 0:
        raise TypeError(f"arrays of dtype {dtype!r} cannot be encoded")
    return dtype.str


def _c_contiguous(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    # np.ascontiguousarray turns 0-d arrays into 1-d ones; copy(order="C") keeps the shape.
    return array if array.flags.c_contiguous else array.copy(order="C")


def zero_padding(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``array``, a native-order array of its own, with the padding bytes of x87 extended
    precision (80 bits in 12 or 16 bytes) set to zero: a long double scalar's padding is
    whatever memory held, and the same number should travel as the same bytes."""
    dtype = array.dtype
    width = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
    if dtype.kind in "fc" and width in (12, 16) and np.finfo(dtype).nmant == 63:
        array.reshape(-1).view(np.uint8).reshape(-1, width)[:, 10:] = 0
    return array


# --- encoding --------------------------------------------------------------------------------

_LITTLE_ENDIAN: Final = sys.byteorder == "little"
#: The bytes before the data of an array's extension, by (dtype, shape); only dtypes whose
#: memory can be sent as it is (a buffer in the wire's byte order) are remembered.
_HEADS: dict[tuple[Any, tuple[int, ...]], bytes] = {}
_HEADS_LIMIT: Final = 4096
_BUFFER_KINDS: Final = frozenset("biufcSUV")


def payload_header(dtype: str, shape: tuple[int, ...] | list[int], nbytes: int) -> bytes:
    """The payload's bytes before the data: ``[dtype, shape,`` and the data's bin header."""
    dims = b"".join([int_bytes(dim) for dim in shape])
    return b"\x93" + str_bytes(dtype) + array_header(len(shape)) + dims + bin_header(nbytes)


def array_head(dtype: str, shape: tuple[int, ...] | list[int], nbytes: int) -> bytes:
    """The bytes of an ext-1 array before its ``nbytes`` of data: the extension's header and
    the payload's (see :func:`payload_header`)."""
    payload = payload_header(dtype, shape, nbytes)
    return ext_header(EXT_NDARRAY, len(payload) + nbytes) + payload


def _remember(key: tuple[Any, tuple[int, ...]], head: bytes) -> None:
    if len(_HEADS) >= _HEADS_LIMIT:  # shapes of variable-length data: start over
        _HEADS.clear()
    _HEADS[key] = head


def append_array(array: np.ndarray[Any, Any], parts: list[Any]) -> None:
    """Append the ext-1 encoding of ``array`` to ``parts`` (joined later with ``b"".join``).

    The data is appended as a view of the array's memory when it is C-contiguous, so the
    array must not change before the parts are joined.

    Raises:
        TypeError: The dtype cannot be encoded (see :func:`wire_dtype`).
    """
    head = _HEADS.get((array.dtype, array.shape))
    if head is not None and array.flags.c_contiguous:
        parts.append(head)
        parts.append(array)  # joined through the buffer protocol: no view object
        return
    dtype = wire_dtype(array.dtype)
    contiguous = _c_contiguous(array)
    raw = contiguous.reshape(-1).view(np.uint8)
    if dtype == BFLOAT16 and not _LITTLE_ENDIAN:  # pragma: no cover - little-endian hosts
        raw = contiguous.reshape(-1).view(np.uint16).byteswap().view(np.uint8)
    head = array_head(dtype, array.shape, raw.nbytes)
    if array.dtype.kind in _BUFFER_KINDS and dtype != BFLOAT16:
        _remember((array.dtype, array.shape), head)
    parts.append(head)
    parts.append(raw.data)


def append_bfloat16(value: BFloat16Array, parts: list[Any]) -> None:
    """Append the ext-1 encoding of a :class:`BFloat16Array` to ``parts``."""
    bits = value.bits
    head = _HEADS.get((BFLOAT16, bits.shape))
    if head is not None and _LITTLE_ENDIAN:
        data = bits.data
        if data.c_contiguous:
            parts.append(head)
            parts.append(data)
            return
    little = _c_contiguous(bits).astype("<u2", copy=False)
    head = array_head(BFLOAT16, bits.shape, little.nbytes)
    if _LITTLE_ENDIAN:
        _remember((BFLOAT16, bits.shape), head)
    parts.append(head)
    parts.append(little.reshape(-1).view(np.uint8).data)


def append_tensor(tensor: Any, parts: list[Any]) -> None:
    """Append the ext-1 encoding of a torch tensor (detached, on the CPU) to ``parts``.

    A contiguous CPU tensor is sent from its own memory, without a copy before the join.

    Raises:
        TypeError: A sparse or quantized tensor, or a dtype with no wire form (float8...).
    """
    import torch  # already imported: the caller holds a tensor

    if tensor.layout != torch.strided:
        raise TypeError(f"only strided (dense) tensors can be encoded, not {tensor.layout}")
    tensor = tensor.detach().cpu().resolve_conj().resolve_neg()
    if tensor.dtype == torch.bfloat16:
        bits = tensor.view(torch.int16).numpy().view(np.uint16)
        append_bfloat16(BFloat16Array(bits), parts)
        return
    try:
        array = tensor.numpy()
    except (TypeError, RuntimeError) as exc:
        raise TypeError(f"tensors of dtype {tensor.dtype} cannot be encoded") from exc
    append_array(array, parts)


def _payload(parts: list[Any]) -> bytes:
    """The payload of the one extension ``parts`` hold (its header cut off)."""
    encoded = b"".join(parts)
    marker = encoded[0]
    start = 2 if 0xD4 <= marker <= 0xD8 else {0xC7: 3, 0xC8: 4, 0xC9: 6}[marker]
    return encoded[start:]


def array_payload(array: np.ndarray[Any, Any]) -> bytes:
    """The ext-1 payload of a NumPy array (any layout, any byte order).

    Raises:
        TypeError: The dtype cannot be encoded (see :func:`wire_dtype`).
    """
    parts: list[Any] = []
    append_array(array, parts)
    return _payload(parts)


def bfloat16_payload(value: BFloat16Array) -> bytes:
    """The ext-1 payload of a :class:`BFloat16Array`."""
    parts: list[Any] = []
    append_bfloat16(value, parts)
    return _payload(parts)


def tensor_to_wire(tensor: Any) -> bytes:
    """The ext-1 payload of a torch tensor (detached, moved to the CPU, made contiguous).

    Raises:
        TypeError: A sparse or quantized tensor, or a dtype with no wire form (float8...).
    """
    parts: list[Any] = []
    append_tensor(tensor, parts)
    return _payload(parts)


def payload_from_parts(dtype: Any, shape: Any, data: Any) -> bytes:
    """Pack an ext-1 payload from its parts (``data`` is any bytes-like object).

    Raises:
        ValueError: ``dtype`` is not a string or ``shape`` not a list of non-negative ints.
    """
    if not isinstance(dtype, str):
        raise ValueError(f"array dtype must be a string, not {type(dtype).__name__}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"array shape must be a list of non-negative ints, not {shape!r}")
    view = memoryview(data).cast("B")
    return payload_header(dtype, shape, len(view)) + view


# --- decoding --------------------------------------------------------------------------------

_Shape = Annotated[tuple[Annotated[int, msgspec.Meta(ge=0)], ...], msgspec.Meta(max_length=64)]


class _Payload(msgspec.Struct, array_like=True, gc=False):
    """``[dtype, shape, data]``, the data copied into a (writable) bytearray."""

    dtype: str
    shape: _Shape
    data: bytearray


class _PayloadView(msgspec.Struct, array_like=True, gc=False):
    """``[dtype, shape, data]``, the data left in the payload (checked to be a bin)."""

    dtype: str
    shape: _Shape
    data: msgspec.Raw


_COPYING: Final = msgspec.msgpack.Decoder(_Payload)
_VIEWING: Final = msgspec.msgpack.Decoder(_PayloadView)
_BIN_HEADER_SIZE: Final = {0xC4: 2, 0xC5: 3, 0xC6: 5}
_DTYPES: dict[str, tuple[str, int, np.dtype[Any]]] = {}
_DTYPES_LIMIT: Final = 256


def dtype_info(dtype_str: str) -> tuple[str, int, np.dtype[Any]]:
    """``(normalised dtype string, itemsize, NumPy dtype)`` of a wire dtype string.

    The dtype string is normalised to carry its byte order (``"f4"`` becomes ``"<f4"``);
    ``"bfloat16"`` is held as little-endian ``uint16``.

    Raises:
        ValueError: The dtype is unknown or may not travel.
    """
    info = _DTYPES.get(dtype_str)
    if info is None:
        info = _dtype_info(dtype_str)
        if len(_DTYPES) < _DTYPES_LIMIT:
            _DTYPES[dtype_str] = info
    return info


@functools.lru_cache(maxsize=256)
def _dtype_info(dtype_str: str) -> tuple[str, int, np.dtype[Any]]:
    if dtype_str == BFLOAT16:
        return BFLOAT16, 2, np.dtype("<u2")
    try:
        dtype = np.dtype(dtype_str)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"unknown array dtype {dtype_str!r}") from exc
    try:
        return wire_dtype(dtype), dtype.itemsize, dtype
    except TypeError as exc:
        raise ValueError(str(exc)) from exc


def _malformed(exc: Exception) -> ValueError:
    return ValueError(f"malformed array payload: {exc}")


def _wrong_size(dtype: str, shape: tuple[int, ...], itemsize: int, size: int) -> ValueError:
    expected = math.prod(shape) * itemsize
    return ValueError(f"array data is {size} bytes, but {dtype} {list(shape)} needs {expected}")


def split_payload(payload: bytes | memoryview) -> tuple[str, tuple[int, ...], memoryview]:
    """Validate an ext-1 payload and split it, without copying the data.

    Returns:
        The normalised dtype string (see :func:`dtype_info`), the shape, and the data as a
        read-only view of ``payload``.

    Raises:
        ValueError: The payload is not ``[dtype, shape, data]`` with ``data`` a msgpack
            ``bin``, the dtype is unknown or not allowed, the shape is not a list of at most
            64 non-negative ints, the data length is not ``prod(shape) * itemsize``, or an
            empty array's other axes pass what NumPy can hold.
    """
    try:
        parts = _VIEWING.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _malformed(exc) from None
    dtype, itemsize, _ = dtype_info(parts.dtype)
    raw = memoryview(parts.data)
    skip = _BIN_HEADER_SIZE.get(raw[0])
    if skip is None:
        raise ValueError("array data must be msgpack bin")
    data = raw[skip:]
    if len(data) != math.prod(parts.shape) * itemsize:
        raise _wrong_size(dtype, parts.shape, itemsize, len(data))
    # NumPy makes no array, even an empty one, whose other axes pass its address space
    if not data and math.prod(filter(None, parts.shape)) * itemsize > sys.maxsize:
        raise ValueError(f"array shape {list(parts.shape)} is past what NumPy can hold")
    return dtype, parts.shape, data


def parse_payload(payload: bytes | memoryview) -> tuple[str, list[int], bytes]:
    """Validate an ext-1 payload and split it into dtype string, shape and data bytes.

    Raises:
        ValueError: As :func:`split_payload`.
    """
    dtype, shape, data = split_payload(payload)
    return dtype, list(shape), bytes(data)


def decode_array(payload: bytes | memoryview) -> np.ndarray[Any, Any] | BFloat16Array:
    """Decode an ext-1 payload into a fresh, writable, C-contiguous NumPy array.

    The data is copied once, out of the payload into the array's memory. A ``"bfloat16"``
    payload becomes a :class:`BFloat16Array`.

    Raises:
        ValueError: The payload is malformed (see :func:`split_payload`).
    """
    return decode_ext(EXT_NDARRAY, payload)


def decode_ext(code: int, payload: bytes | memoryview) -> np.ndarray[Any, Any] | BFloat16Array:
    """A msgpack ``ext_hook``: extension type 1 decoded by :func:`decode_array`.

    Raises:
        ValueError: Another extension type, or a malformed payload.
    """
    if code != EXT_NDARRAY:
        raise ValueError(f"unknown msgpack extension type {code}")
    try:
        parts = _COPYING.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _malformed(exc) from None
    dtype_str, itemsize, dtype = _DTYPES.get(parts.dtype) or dtype_info(parts.dtype)
    data = parts.data
    try:
        array = np.ndarray(parts.shape, dtype, data)
    except (TypeError, ValueError):  # too little data, or a shape past the address space
        array = None
    if array is None or array.nbytes != len(data):
        raise _wrong_size(dtype_str, parts.shape, itemsize, len(data))
    if dtype_str == BFLOAT16:
        if not _LITTLE_ENDIAN:  # pragma: no cover - little-endian hosts
            array = array.astype(np.uint16)
        return BFloat16Array(array)
    return array
