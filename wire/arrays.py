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

Torch is never imported here: a tensor can only be handed over if torch is already imported,
so :func:`torch_tensor_type` looks it up in ``sys.modules``.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "BFLOAT16",
    "EXT_NDARRAY",
    "BFloat16Array",
    "array_payload",
    "bfloat16_payload",
    "decode_array",
    "parse_payload",
    "payload_from_parts",
    "tensor_to_wire",
    "torch_tensor_type",
    "wire_dtype",
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

    def to_float32(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        """The values as float32; exact, since every bfloat16 is a float32."""
        widened = self.bits.astype(np.uint32) << np.uint32(16)
        return widened.view(np.float32)

    def to_torch(self) -> torch.Tensor:
        """The values as a ``torch.bfloat16`` tensor with the same bits (imports torch)."""
        import torch

        bits = self.bits.copy(order="C").view(np.int16)
        return torch.from_numpy(bits).view(torch.bfloat16)

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


def payload_from_parts(dtype: str, shape: list[int], data: Any) -> bytes:
    """Pack an ext-1 payload from its parts (``data`` is any bytes-like object)."""
    packed: bytes = msgpack.packb([dtype, shape, data], use_bin_type=True)
    return packed


def array_payload(array: np.ndarray[Any, Any]) -> bytes:
    """The ext-1 payload of a NumPy array (any layout, any byte order).

    Raises:
        TypeError: The dtype cannot be encoded (see :func:`wire_dtype`).
    """
    dtype = wire_dtype(array.dtype)
    contiguous = _c_contiguous(array)
    raw = contiguous.reshape(-1).view(np.uint8)
    if dtype == BFLOAT16 and sys.byteorder == "big":  # pragma: no cover - little-endian hosts
        raw = contiguous.reshape(-1).view(np.uint16).byteswap().view(np.uint8)
    return payload_from_parts(dtype, list(array.shape), raw.data)


def bfloat16_payload(value: BFloat16Array) -> bytes:
    """The ext-1 payload of a :class:`BFloat16Array`."""
    bits = _c_contiguous(value.bits).astype("<u2", copy=False)
    return payload_from_parts(BFLOAT16, list(bits.shape), bits.reshape(-1).view(np.uint8).data)


def tensor_to_wire(tensor: Any) -> bytes:
    """The ext-1 payload of a torch tensor (detached, moved to the CPU, made contiguous).

    Raises:
        TypeError: A sparse or quantized tensor, or a dtype with no wire form (float8...).
    """
    import torch  # already imported: the caller holds a tensor

    if tensor.layout != torch.strided:
        raise TypeError(f"only strided (dense) tensors can be encoded, not {tensor.layout}")
    tensor = tensor.detach().cpu().resolve_conj().resolve_neg()
    if tensor.dtype == torch.bfloat16:
        bits = tensor.contiguous().view(torch.int16).numpy().view(np.uint16)
        return bfloat16_payload(BFloat16Array(bits))
    try:
        array = tensor.numpy()
    except (TypeError, RuntimeError) as exc:
        raise TypeError(f"tensors of dtype {tensor.dtype} cannot be encoded") from exc
    return array_payload(array)


def parse_payload(payload: bytes | memoryview) -> tuple[str, list[int], bytes]:
    """Validate an ext-1 payload and split it into dtype string, shape and data bytes.

    The dtype string is normalised to carry its byte order (``"f4"`` becomes ``"<f4"``).

    Raises:
        ValueError: The payload is not ``[dtype, shape, data]`` with ``data`` a msgpack
            ``bin``, the dtype is unknown or not allowed, the shape is not a list of
            non-negative ints, or the data length is not ``prod(shape) * itemsize``.
    """
    try:
        parts = msgpack.unpackb(payload, raw=False, use_list=True)
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        raise ValueError(f"malformed array payload: {exc}") from exc
    if not isinstance(parts, list) or len(parts) != 3:
        raise ValueError("an array payload is [dtype, shape, data]")
    dtype_str, shape, data = parts
    if not isinstance(dtype_str, str):
        raise ValueError(f"array dtype must be a string, not {type(dtype_str).__name__}")
    dtype_str, itemsize = _dtype_info(dtype_str)[:2]
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_NDIM
        or not all(type(dim) is int and dim >= 0 for dim in shape)
    ):
        raise ValueError(f"array shape must be a list of non-negative ints, not {shape!r}")
    if not isinstance(data, bytes):
        raise ValueError("array data must be msgpack bin")
    expected = math.prod(shape) * itemsize
    if len(data) != expected:
        raise ValueError(
            f"array data is {len(data)} bytes, but {dtype_str} {shape} needs {expected}"
        )
    return dtype_str, shape, data


@functools.lru_cache(maxsize=256)
def _dtype_info(dtype_str: str) -> tuple[str, int, np.dtype[Any]]:
    """``(normalised dtype string, itemsize, NumPy dtype)``; cached, as batches repeat dtypes."""
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


def decode_array(payload: bytes | memoryview) -> np.ndarray[Any, Any] | BFloat16Array:
    """Decode an ext-1 payload into a fresh, writable, C-contiguous NumPy array.

    A ``"bfloat16"`` payload becomes a :class:`BFloat16Array`.

    Raises:
        ValueError: The payload is malformed (see :func:`parse_payload`).
    """
    dtype_str, shape, data = parse_payload(payload)
    dtype = _dtype_info(dtype_str)[2]
    if dtype_str == BFLOAT16:
        bits = np.frombuffer(data, dtype=dtype).astype(np.uint16).reshape(shape)
        return BFloat16Array(bits)
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
