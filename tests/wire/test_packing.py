"""The hand-laid encoder writes the very bytes msgpack-python writes for the same value."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlreplay.wire.arrays import (
    EXT_NDARRAY,
    BFloat16Array,
    array_head,
    decode_array,
    payload_header,
    split_payload,
)
from rlreplay.wire.codec import packb, unpackb
from rlreplay.wire.headers import (
    array_header,
    bin_header,
    ext_header,
    int_bytes,
    map_header,
    str_bytes,
    str_header,
)
from rlreplay.wire.packing import is_plain
from tests.wire.test_codec import DTYPES as FIXED_WIDTH_DTYPES

INT_EDGES = [
    0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1,
    -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63),
]  # fmt: skip
SIZES = [0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536]


@pytest.mark.parametrize("value", INT_EDGES)
def test_ints_are_packed_as_msgpack_packs_them(value: int) -> None:
    assert int_bytes(value) == msgpack.packb(value)


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1])
def test_ints_past_64_bits_are_refused(value: int) -> None:
    with pytest.raises(ValueError):
        int_bytes(value)


@pytest.mark.parametrize("size", SIZES)
def test_headers_are_msgpacks(size: int) -> None:
    assert str_bytes("x" * size) == msgpack.packb("x" * size, use_bin_type=True)
    assert str_header(size) + b"x" * size == str_bytes("x" * size)
    assert bin_header(size) + b"b" * size == msgpack.packb(b"b" * size, use_bin_type=True)
    assert array_header(size) == msgpack.packb([0] * size)[: len(array_header(size))]
    assert map_header(size) == msgpack.packb({i: 0 for i in range(size)})[: len(map_header(size))]
    ext = msgpack.packb(msgpack.ExtType(EXT_NDARRAY, b"p" * size))
    assert ext_header(EXT_NDARRAY, size) + b"p" * size == ext


def old_default(obj: Any) -> Any:
    """The codec's encoding before the hand-laid one: msgpack-python packing every payload."""
    if isinstance(obj, np.ndarray):
        array = obj if obj.flags.c_contiguous else obj.copy(order="C")
        from rlreplay.wire.arrays import wire_dtype

        raw = array.reshape(-1).view(np.uint8).tobytes()
        payload = msgpack.packb([wire_dtype(obj.dtype), list(obj.shape), raw], use_bin_type=True)
        return msgpack.ExtType(EXT_NDARRAY, payload)
    if isinstance(obj, np.generic):
        value = obj.item()
        if isinstance(value, bool | int | float | str | bytes):
            return value
        return old_default(np.asarray(obj))
    raise TypeError(type(obj))


def old_packb(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, default=old_default, use_bin_type=True, datetime=False)
    return packed


DTYPES = st.one_of(
    FIXED_WIDTH_DTYPES,
    st.just(np.dtype("<M8[ns]")),
    st.just(np.dtype("S3")),
)
ARRAYS = hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.binary(max_size=300),
)
VALUES = st.recursive(
    SCALARS | ARRAYS,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=40) | st.integers(-(2**63), 2**63), inner, max_size=20)
    ),
    max_leaves=30,
)


@given(VALUES)
@settings(max_examples=400, deadline=None)
def test_values_pack_to_the_bytes_msgpack_python_writes(value: Any) -> None:
    assert packb(value) == old_packb(value)


PLAIN_VALUES = st.recursive(
    SCALARS | ARRAYS,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=40), inner, max_size=8)
    ),
    max_leaves=30,
)


@given(PLAIN_VALUES | st.lists(st.dictionaries(st.text(max_size=10), PLAIN_VALUES), max_size=6))
@settings(max_examples=300, deadline=None)
def test_plain_values_pack_as_msgpack_python_packs_them(value: Any) -> None:
    """The usual value (maps with str keys, lists, arrays, scalars) goes to msgspec's
    encoder; its bytes are the same (twice: the second time an array's header comes from
    the cache)."""
    assert is_plain(value)
    assert packb(value) == old_packb(value)
    assert packb(value) == old_packb(value)


def test_values_nested_past_the_depth_bound_are_not_plain() -> None:
    deep: Any = np.zeros(2)
    for _ in range(40):
        deep = {"x": deep}
    assert not is_plain(deep)
    assert packb(deep) == old_packb(deep)
    assert not is_plain({1: np.zeros(2)}) and not is_plain([np.float32(1)])


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1])
def test_a_flat_map_with_an_int_past_64_bits_is_refused(value: int) -> None:
    with pytest.raises(ValueError, match="64 bits"):
        packb({"x": np.zeros(2), "n": value})


def test_non_contiguous_fortran_and_big_endian_arrays_pack_their_c_order_values() -> None:
    base = np.arange(24, dtype=">f8").reshape(4, 6)
    for array in (base[:, ::2], np.asfortranarray(base), base.T, base[::-1]):
        packed = packb({"a": array})
        assert packed == old_packb({"a": array})
        back = unpackb(packed)["a"]
        assert back.dtype.str == ">f8" and np.array_equal(back, array)


def test_an_array_changed_after_packing_does_not_change_the_bytes() -> None:
    array = np.zeros(4, dtype="<i4")
    first = packb({"a": array})
    array[:] = 7
    assert unpackb(first)["a"].tolist() == [0, 0, 0, 0]
    assert unpackb(packb({"a": array}))["a"].tolist() == [7, 7, 7, 7]


def test_tensors_and_bfloat16_pack_like_their_arrays() -> None:
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert packb({"t": tensor}) == packb({"t": tensor.numpy()})
    assert packb({"t": tensor.T}) == packb({"t": np.ascontiguousarray(tensor.numpy().T)})
    bf16 = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    bits = BFloat16Array(bf16.view(torch.int16).numpy().view(np.uint16))
    assert packb({"b": bf16}) == packb({"b": bits})
    assert unpackb(packb({"b": bf16}))["b"] == bits


def test_headers_and_payloads_agree_with_decoding() -> None:
    array = np.arange(300, dtype="<u2").reshape(3, 100)
    head = array_head("<u2", (3, 100), array.nbytes)
    encoded = head + array.tobytes()
    ext = msgpack.unpackb(encoded)
    assert ext.code == EXT_NDARRAY
    assert ext.data.startswith(payload_header("<u2", [3, 100], array.nbytes))
    dtype, shape, data = split_payload(ext.data)
    assert (dtype, shape, bytes(data)) == ("<u2", (3, 100), array.tobytes())
    decoded = decode_array(ext.data)
    assert isinstance(decoded, np.ndarray) and decoded.flags.writeable
    assert np.array_equal(decoded, array)


@pytest.mark.parametrize(
    "payload",
    [
        ["<f4", [2], b"\x00" * 4],
        ["<f4", [2], "12345678"],
        ["<f4", [-1], b""],
        ["<f4", [True], b"\x00" * 4],
        ["<f4", [2.0], b"\x00" * 8],
        ["object", [1], b"\x00" * 8],
        [4, [1], b"\x00" * 4],
        ["<f4", [1] * 65, b"\x00" * 4],
        ["<f4", [2**40, 2**40], b""],
    ],
)
def test_malformed_payloads_are_refused(payload: list[Any]) -> None:
    raw = msgpack.packb(payload, use_bin_type=True)
    with pytest.raises(ValueError):
        decode_array(raw)
    with pytest.raises(ValueError):
        split_payload(raw)


def test_a_zero_size_array_of_any_shape_round_trips() -> None:
    for shape in [(0,), (3, 0), (0, 0, 2)]:
        array = np.zeros(shape, dtype="<c8")
        back = unpackb(packb(array))
        assert back.shape == shape and math.prod(back.shape) == 0
