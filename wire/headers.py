"""Msgpack headers and scalars laid out by hand, byte for byte as msgpack-python packs them.

The codec's encoder (:mod:`rlreplay.wire.packing`) and the server's columnar bodies build
msgpack around array data without a packer: these functions give the bytes msgpack-python
(``use_bin_type=True``) writes for the same value, so a value has one encoding whoever
packs it. ``tests/wire/test_packing.py`` compares them with msgpack-python.
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = [
    "array_header",
    "bin_header",
    "ext_header",
    "float_bytes",
    "int_bytes",
    "map_header",
    "map_size",
    "read_ext_header",
    "str_bytes",
    "str_header",
]

_INT_BYTES: Final = tuple(bytes((n,)) for n in range(0x80))
_NEG_FIXINT: Final = tuple(bytes((0x100 + n,)) for n in range(-32, 0))
_FIXEXT: Final = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
_FIXEXT_SIZES: Final = {marker: size for size, marker in _FIXEXT.items()}
_EXT_SIZE_BYTES: Final = {0xC7: 1, 0xC8: 2, 0xC9: 4}
_U8, _U16, _U32, _U64 = (struct.Struct(f">B{c}").pack for c in "BHIQ")
_I8, _I16, _I32, _I64 = (struct.Struct(f">B{c}").pack for c in "bhiq")
_F64: Final = struct.Struct(">Bd").pack


def int_bytes(value: int) -> bytes:
    """The msgpack int of ``value``: the shortest form, unsigned for values >= 0.

    Raises:
        ValueError: ``value`` needs more than 64 bits.
    """
    if value >= 0:
        if value < 0x80:
            return _INT_BYTES[value]
        if value < 0x100:
            return _U8(0xCC, value)
        if value < 0x10000:
            return _U16(0xCD, value)
        if value < 0x100000000:
            return _U32(0xCE, value)
        if value < 0x10000000000000000:
            return _U64(0xCF, value)
    elif value >= -32:
        return _NEG_FIXINT[value + 32]
    elif value >= -0x80:
        return _I8(0xD0, value)
    elif value >= -0x8000:
        return _I16(0xD1, value)
    elif value >= -0x80000000:
        return _I32(0xD2, value)
    elif value >= -0x8000000000000000:
        return _I64(0xD3, value)
    raise ValueError(f"int {value} does not fit in 64 bits")


def float_bytes(value: float) -> bytes:
    """A float as msgpack float64 (msgpack-python's default for Python floats)."""
    return _F64(0xCB, value)


def _sized(size: int, fix: int, fix_limit: int, markers: tuple[int, int, int]) -> bytes:
    if size < fix_limit:
        return bytes((fix | size,))
    if size < 0x100 and markers[0]:
        return bytes((markers[0], size))
    if size < 0x10000:
        return bytes((markers[1],)) + size.to_bytes(2, "big")
    if size < 0x100000000:
        return bytes((markers[2],)) + size.to_bytes(4, "big")
    raise ValueError(f"a msgpack object of {size} entries or bytes is too large")


def str_bytes(text: str) -> bytes:
    """A str as msgpack (fixstr, str8, str16, str32).

    Raises:
        UnicodeEncodeError: ``text`` holds a lone surrogate.
    """
    data = text.encode("utf-8")
    n = len(data)
    if n < 32:
        return bytes((0xA0 | n,)) + data
    return str_header(n) + data


def str_header(size: int) -> bytes:
    """The header of a msgpack str of ``size`` bytes of UTF-8."""
    return _sized(size, 0xA0, 32, (0xD9, 0xDA, 0xDB))


def bin_header(size: int) -> bytes:
    """The header of a msgpack bin of ``size`` bytes."""
    return _sized(size, 0, 0, (0xC4, 0xC5, 0xC6))


def array_header(length: int) -> bytes:
    """The header of a msgpack array of ``length`` elements."""
    return _sized(length, 0x90, 16, (0, 0xDC, 0xDD))


def map_header(length: int) -> bytes:
    """The header of a msgpack map of ``length`` entries."""
    return _sized(length, 0x80, 16, (0, 0xDE, 0xDF))


def ext_header(code: int, size: int) -> bytes:
    """The header of a msgpack extension of type ``code`` with a ``size``-byte payload."""
    fix = _FIXEXT.get(size)
    if fix is not None:
        return bytes((fix, code & 0xFF))
    if size < 0x100:
        return bytes((0xC7, size, code & 0xFF))
    if size < 0x10000:
        return b"\xc8" + size.to_bytes(2, "big") + bytes((code & 0xFF,))
    if size < 0x100000000:
        return b"\xc9" + size.to_bytes(4, "big") + bytes((code & 0xFF,))
    raise ValueError(f"an extension payload of {size} bytes is too large")


def read_ext_header(data: bytes | memoryview, pos: int = 0) -> tuple[int, int, int] | None:
    """The extension at ``data[pos]``: its type code, where its payload starts and its size.

    Returns:
        ``(code, start, size)``, or None when ``data[pos]`` starts no extension.

    Raises:
        IndexError: ``data`` ends inside the header.
    """
    marker = data[pos]
    size = _FIXEXT_SIZES.get(marker)
    if size is not None:
        code_at = pos + 1
    else:
        width = _EXT_SIZE_BYTES.get(marker)
        if width is None:
            return None
        code_at = pos + 1 + width
        if code_at > len(data):
            raise IndexError("truncated extension header")
        size = int.from_bytes(data[pos + 1 : code_at], "big")
    code = data[code_at]
    return (code - 0x100 if code >= 0x80 else code), code_at + 1, size


def map_size(data: bytes | memoryview) -> int | None:
    """The number of entries of the msgpack map ``data`` starts with; None if it is no map."""
    head = data[0]
    if 0x80 <= head <= 0x8F:
        return head & 0x0F
    if head == 0xDE and len(data) >= 3:
        return int.from_bytes(data[1:3], "big")
    if head == 0xDF and len(data) >= 5:
        return int.from_bytes(data[1:5], "big")
    return None
