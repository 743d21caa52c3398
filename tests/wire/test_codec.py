"""The wire codec: arrays and tensors round-trip bit-exactly; bad input raises ValueError."""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlreplay.clients import BFloat16Array
from rlreplay.wire.codec import (
    EXT_NDARRAY,
    from_jsonable,
    jsonable_to_msgpack,
    msgpack_to_jsonable,
    packb,
    spell_floats,
    to_jsonable,
    unpackb,
)

# --- helpers -------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Deep equality where arrays must match in type, dtype, shape and every bit."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            type(a) is type(b) is np.ndarray
            and a.dtype == b.dtype
            and a.dtype.str == b.dtype.str
            and a.shape == b.shape
            and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
        )
    if isinstance(a, BFloat16Array) or isinstance(b, BFloat16Array):
        return isinstance(a, BFloat16Array) and isinstance(b, BFloat16Array) and a == b
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and list(a) == list(b)
            and all(type(k) is type(j) for k, j in zip(a, b, strict=True))
            and all(same(a[k], b[k]) for k in a)
        )
    if isinstance(a, list | tuple):
        return (
            isinstance(b, list)
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    as_int = width[a.element_size()]
    return torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))


# Every fixed-width dtype, both byte orders where they have one.
DTYPES = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="?"),
    hnp.unsigned_integer_dtypes(endianness="?"),
    hnp.floating_dtypes(endianness="?"),
    hnp.complex_number_dtypes(endianness="?"),
)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)


@st.composite
def raw_arrays(draw: st.DrawFn) -> np.ndarray:
    """Arrays of arbitrary bits: NaN payloads, -0.0, subnormals, infinities."""
    dtype = draw(DTYPES)
    shape = draw(SHAPES)
    size = math.prod(shape) * dtype.itemsize
    if dtype.kind == "b":
        return draw(hnp.arrays(dtype, shape))
    raw = draw(st.binary(min_size=size, max_size=size))
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


@st.composite
def strided(draw: st.DrawFn) -> np.ndarray:
    """Arrays that are not C-contiguous: reversed, stepped or transposed views."""
    array = draw(raw_arrays())
    if array.ndim == 0:
        return array
    choice = draw(st.sampled_from(["reverse", "step", "transpose"]))
    if choice == "reverse":
        return array[::-1]
    if choice == "step":
        return array[::2]
    return array.T


# --- msgpack arrays ------------------------------------------------------------------------


@given(raw_arrays() | strided())
@settings(max_examples=300)
def test_arrays_round_trip_bit_exactly(array: np.ndarray) -> None:
    decoded = unpackb(packb(array))
    assert same(decoded, array)
    assert decoded.flags.c_contiguous and decoded.flags.writeable


@given(raw_arrays())
def test_arrays_nested_in_values_round_trip(array: np.ndarray) -> None:
    value = {"obs": array, "extra": [array, {"r": 1.5}], "raw": b"\x00\xff"}
    assert same(unpackb(packb(value)), value)


@pytest.mark.parametrize(
    ("array", "dtype"),
    [
        (np.zeros(2, np.float32), "<f4"),
        (np.zeros(2, np.uint8), "|u1"),
        (np.zeros(2, np.int64), "<i8"),
        (np.zeros(2, np.bool_), "|b1"),
        (np.zeros(2, ">f8"), ">f8"),
        (np.zeros((), np.float16), "<f2"),
    ],
)
def test_the_wire_form_is_the_contracts(array: np.ndarray, dtype: str) -> None:
    ext = msgpack.unpackb(packb(array))
    assert isinstance(ext, msgpack.ExtType) and ext.code == EXT_NDARRAY == 1
    assert msgpack.unpackb(ext.data) == [dtype, list(array.shape), array.tobytes()]


def test_wire_bytes_are_exactly_ext_1_of_dtype_shape_data() -> None:
    array = np.array([[1, 2, 3], [4, 5, 6]], dtype="<i4")
    payload = msgpack.packb(["<i4", [2, 3], array.tobytes()], use_bin_type=True)
    assert packb(array) == msgpack.packb(msgpack.ExtType(1, payload))
    assert same(unpackb(msgpack.packb(msgpack.ExtType(1, payload))), array)


def test_special_float_bits_survive() -> None:
    bits = np.array([0x7FC00001, 0xFFC12345, 0x80000000, 0x00000001, 0x7F800000], dtype="<u4")
    array = bits.view("<f4")
    decoded = unpackb(packb(array))
    assert decoded.view("<u4").tolist() == bits.tolist()


def test_a_dtype_without_byte_order_is_normalised() -> None:
    payload = msgpack.packb(["f4", [1], b"\x00\x00\x80\x3f"], use_bin_type=True)
    decoded = unpackb(msgpack.packb(msgpack.ExtType(1, payload)))
    assert decoded.dtype.str == "<f4" and decoded.tolist() == [1.0]


def test_numpy_scalars_become_python_scalars() -> None:
    value = [np.float32(0.5), np.int64(-3), np.uint8(7), np.bool_(True), np.float64(2.5)]
    decoded = unpackb(packb(value))
    assert decoded == [0.5, -3, 7, True, 2.5]
    assert [type(x) for x in decoded] == [float, int, int, bool, float]


def test_numpy_scalars_without_a_python_type_become_0d_arrays() -> None:
    decoded = unpackb(packb(np.complex64(1 + 2j)))
    assert same(decoded, np.array(1 + 2j, dtype=np.complex64))


def test_maps_with_non_string_keys_round_trip() -> None:
    value = {1: "a", b"k": [1, 2], -2.5: None, False: {}, None: 0}
    assert same(unpackb(packb(value)), value)


def test_tuples_become_lists() -> None:
    assert unpackb(packb((1, (2, 3)))) == [1, [2, 3]]


@pytest.mark.parametrize(
    "value",
    [
        {1, 2},
        np.array([object()], dtype=object),
        np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]),
        object(),
    ],
    ids=["set", "object-array", "structured-array", "object"],
)
def test_values_without_a_wire_form_raise_type_error(value: Any) -> None:
    with pytest.raises(TypeError):
        packb(value)


def test_ints_beyond_64_bits_raise_value_error() -> None:
    with pytest.raises(ValueError):
        packb(2**64)


# --- torch ---------------------------------------------------------------------------------

TORCH_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]


def tensor_back(decoded: Any) -> torch.Tensor:
    if isinstance(decoded, BFloat16Array):
        return decoded.to_torch()
    return torch.from_numpy(decoded)


@given(
    dtype=st.sampled_from(TORCH_DTYPES),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
    data=st.data(),
    transpose=st.booleans(),
)
@settings(max_examples=200)
def test_tensors_round_trip_bit_exactly(
    dtype: torch.dtype, shape: tuple[int, ...], data: st.DataObject, transpose: bool
) -> None:
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = data.draw(
        st.binary(min_size=math.prod(shape) * itemsize, max_size=math.prod(shape) * itemsize)
    )
    if dtype == torch.bool:
        tensor = torch.tensor([b & 1 for b in raw], dtype=torch.bool).reshape(shape)
    else:
        tensor = (
            torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
            if raw
            else torch.empty(shape, dtype=dtype)
        )
    if transpose and tensor.ndim >= 2:
        tensor = tensor.transpose(0, 1)  # not contiguous
    assert bits_equal(tensor_back(unpackb(packb({"t": tensor}))["t"]), tensor)


def test_bfloat16_travels_as_bfloat16_and_converts_exactly() -> None:
    tensor = torch.tensor([1.5, -0.0, float("inf"), 3.140625], dtype=torch.bfloat16)
    ext = msgpack.unpackb(packb(tensor))
    dtype, shape, data = msgpack.unpackb(ext.data)
    assert (dtype, shape) == ("bfloat16", [4])
    assert data == tensor.view(torch.int16).numpy().astype("<i2").tobytes()
    decoded = unpackb(packb(tensor))
    assert isinstance(decoded, BFloat16Array) and decoded.shape == (4,)
    assert bits_equal(decoded.to_torch(), tensor)
    assert np.asarray(decoded).tolist() == [1.5, -0.0, float("inf"), 3.140625]
    assert same(unpackb(packb(decoded)), decoded)


def test_bfloat16_arrays_index_like_numpy_arrays() -> None:
    tensor = torch.arange(6, dtype=torch.bfloat16).reshape(3, 2)
    column = BFloat16Array(tensor.view(torch.int16).numpy().view(np.uint16).copy())
    assert (len(column), column.ndim, column.dtype) == (3, 2, "bfloat16")
    row = column[1]  # a row of a column, as a ColumnBatch's columns give them
    assert isinstance(row, BFloat16Array) and row.shape == (2,)
    assert bits_equal(row.to_torch(), tensor[1])
    assert bits_equal(column[::2].to_torch(), tensor[::2])  # strided: bits copied C-contiguous
    assert column[::2].bits.flags.c_contiguous
    one = column[2, 1]
    assert one.shape == () and one.ndim == 0 and np.asarray(one).item() == 5.0
    row.bits[0] = 0  # a copy: the column keeps its values
    assert np.asarray(column[1]).tolist() == [2.0, 3.0]
    with pytest.raises(TypeError):
        len(one)
    with pytest.raises(IndexError):
        column[3]


def test_tensors_needing_grad_or_with_lazy_negation_encode_their_values() -> None:
    leaf = torch.arange(4, dtype=torch.float32, requires_grad=True)
    assert unpackb(packb(leaf * 2)).tolist() == [0, 2, 4, 6]
    conj = torch.tensor([1 + 2j], dtype=torch.complex64).conj()
    assert unpackb(packb(conj)).tolist() == [1 - 2j]


def test_tensors_without_a_wire_form_raise_type_error() -> None:
    with pytest.raises(TypeError):
        packb(torch.zeros(2, dtype=torch.float8_e4m3fn))
    with pytest.raises(TypeError):
        packb(torch.zeros(2, 2).to_sparse())


# --- malformed input -----------------------------------------------------------------------


def ext(payload: Any, code: int = EXT_NDARRAY) -> bytes:
    raw = payload if isinstance(payload, bytes) else msgpack.packb(payload, use_bin_type=True)
    return msgpack.packb(msgpack.ExtType(code, raw))


@given(raw_arrays(), st.data())
def test_truncated_input_raises_value_error(array: np.ndarray, data: st.DataObject) -> None:
    encoded = packb({"obs": array, "k": "v"})
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    with pytest.raises(ValueError):
        unpackb(encoded[:cut])


@pytest.mark.parametrize(
    "encoded",
    [
        ext(["<f4", [2]]),  # two parts
        ext({"dtype": "<f4"}),  # not an array
        ext([4, [1], b"\x00" * 4]),  # dtype not a string
        ext(["<q9", [1], b"\x00"]),  # unknown dtype
        ext(["|O", [1], b"\x00" * 8]),  # object dtype
        ext(["<i4,<f4", [1], b"\x00" * 8]),  # structured dtype
        ext(["<f4", [-1], b""]),  # negative dim
        ext(["<f4", [True], b"\x00" * 4]),  # bool dim
        ext(["<f4", 2, b"\x00" * 8]),  # shape not a list
        ext(["<f4", [3], b"\x00" * 8]),  # data too short
        ext(["<f4", [1], b"\x00" * 8]),  # data too long
        ext(["<f4", [1], "abcd"]),  # data a str, not bin
        ext(msgpack.packb(["<f4", [1], b"\x00" * 4], use_bin_type=True) + b"\xc0"),  # trailing
        ext(msgpack.packb(["<f4", [1], b"\x00" * 4], use_bin_type=True)[:-1]),  # truncated
        ext(b""),  # empty payload
        ext(["<f4", [1], b"\x00" * 4], code=2),  # unknown ext type
        packb([1, 2]) + b"\x01",  # trailing data
        b"\xc1",  # never-used byte
        b"\xa2\xff\xfe",  # invalid UTF-8
        b"",
    ],
)
def test_malformed_msgpack_raises_value_error(encoded: bytes) -> None:
    with pytest.raises(ValueError):
        unpackb(encoded)
    with pytest.raises(ValueError):
        msgpack_to_jsonable(encoded)


def test_unhashable_map_keys_raise_value_error() -> None:
    with pytest.raises(ValueError):
        unpackb(b"\x81\x80\x01")  # {{}: 1}
    with pytest.raises(ValueError):
        unpackb(b"\x81\x91\x80\x01")  # {[{}]: 1}


def test_arrays_as_map_keys_decode_as_tuples() -> None:
    encoded = msgpack.packb({(1, (2, 3)): [4, [5]], "x": [(6,)]})
    assert unpackb(encoded) == {(1, (2, 3)): [4, [5]], "x": [[6]]}


def test_timestamps_decode_to_utc_datetimes() -> None:
    when = datetime.datetime(2026, 11, 22, 9, 30, 1, 250000, tzinfo=datetime.UTC)
    assert unpackb(msgpack.packb({"t": when}, datetime=True)) == {"t": when}


def test_where_msgspec_and_msgpack_differ_the_codec_decodes_alike() -> None:
    """msgspec decodes; what it refuses, msgpack decodes or explains (``malformed msgpack``)."""
    sample = {
        "items": [
            {"key": f"k{i}", "value": {"obs": np.arange(i, dtype="<f4"), "b": b"x" * i}, "w": 0.5}
            for i in range(4)
        ],
        "n": [None, True, -(2**63), 2**64 - 1, 1.5, "é"],
    }
    assert same(unpackb(packb(sample)), sample)
    assert unpackb(msgpack.packb({(1,): [2]})) == {(1,): [2]}
    for bad in (
        b"\xa3ab",  # truncated
        b"\x01\x02",  # trailing bytes
        b"\xa2\xff\xfe",  # not UTF-8
        b"\xc1",  # never used
        msgpack.packb(msgpack.ExtType(5, b"x")),  # unknown extension
        b"\x91" * 5000 + b"\x01",  # too deep
        b"\x81\x80\x01",  # a map as a key
        b"\xc7\x0c\xff" + (2**62).to_bytes(12, "big"),  # a timestamp past datetime's range
    ):
        with pytest.raises(ValueError, match="malformed msgpack"):
            unpackb(bad)


def test_accepts_memoryview() -> None:
    encoded = packb({"a": np.arange(3)})
    assert same(unpackb(memoryview(encoded)), {"a": np.arange(3)})


# --- JSON form -----------------------------------------------------------------------------

json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    # the NaN that "$float" spells back is math.nan, so msgpack bytes compare equal too
    | st.sampled_from([math.nan, math.inf, -math.inf])
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | raw_arrays()
)
keys = (
    st.text(max_size=6)
    | st.sampled_from(["$bytes", "$ndarray", "$float", "$map"])
    | st.integers(-5, 5)
    | st.sampled_from([-0.5, math.inf])
)
values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=10,
)


@given(values)
@settings(max_examples=300)
def test_json_form_round_trips_through_json_text(value: Any) -> None:
    text = json.dumps(to_jsonable(value), allow_nan=False)
    assert same(from_jsonable(json.loads(text)), value)


@given(values)
@settings(max_examples=200)
def test_json_and_msgpack_forms_convert_into_each_other(value: Any) -> None:
    encoded = packb(value)
    assert spell_floats(msgpack_to_jsonable(encoded)) == to_jsonable(value)
    assert jsonable_to_msgpack(to_jsonable(value)) == encoded


def test_json_form_shapes() -> None:
    value = {"a": np.array([1.0], dtype="<f4"), "b": b"\x01", 2: "two"}
    assert to_jsonable(value) == {
        "$map": [
            ["a", {"$ndarray": {"dtype": "<f4", "shape": [1], "data": "AACAPw=="}}],
            ["b", {"$bytes": "AQ=="}],
            [2, "two"],
        ]
    }
    assert to_jsonable({"a": b"\x01"}) == {"a": {"$bytes": "AQ=="}}


def test_maps_that_look_like_tags_are_escaped() -> None:
    lookalike = {"$bytes": "AQ=="}
    assert to_jsonable(lookalike) == {"$map": [["$bytes", "AQ=="]]}
    assert from_jsonable(to_jsonable(lookalike)) == lookalike
    assert from_jsonable(lookalike) == b"\x01"


def test_json_form_of_bfloat16_and_scalars() -> None:
    tensor = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)
    form = to_jsonable({"t": tensor, "s": np.float32(0.5), "n": np.int16(3)})
    assert form["t"]["$ndarray"]["dtype"] == "bfloat16"
    assert form["s"] == 0.5 and type(form["s"]) is float and type(form["n"]) is int
    assert bits_equal(from_jsonable(form)["t"].to_torch(), tensor)


def test_jsonable_to_msgpack_normalises_dtype_and_builds_ext_arrays() -> None:
    form = {"x": {"$ndarray": {"dtype": "i2", "shape": [2], "data": "AQACAA=="}}}
    decoded = unpackb(jsonable_to_msgpack(form))
    assert same(decoded, {"x": np.array([1, 2], dtype="<i2")})


@pytest.mark.parametrize(
    "form",
    [
        {"$bytes": "not base64!"},
        {"$bytes": 3},
        {"$ndarray": {"dtype": "<f4", "shape": [2], "data": "AAAAAA=="}},  # 4 bytes for 8
        {"$ndarray": {"dtype": "<f4", "shape": [1]}},
        {"$ndarray": {"dtype": "|O", "shape": [1], "data": "AAAAAAAAAAA="}},
        {"$ndarray": [1, 2]},
        {"$map": [[1]]},
        {"$map": {"a": 1}},
        {"$map": [[[1], 2]]},  # unhashable key
        {"$float": "nan"},
        {"$float": "inf"},
        {"$float": "1.5"},
        {"$float": 1.5},
        {"$float": None},
    ],
)
def test_malformed_json_forms_raise_value_error(form: Any) -> None:
    with pytest.raises(ValueError):
        from_jsonable(form)
    with pytest.raises(ValueError):
        jsonable_to_msgpack(form)


def test_msgpack_to_jsonable_of_stored_value() -> None:
    stored = packb({"obs": np.arange(2, dtype="|u1"), "raw": b"\xff"})
    assert msgpack_to_jsonable(stored) == {
        "obs": {"$ndarray": {"dtype": "|u1", "shape": [2], "data": "AAE="}},
        "raw": {"$bytes": "/w=="},
    }


NAN, INF = math.nan, math.inf


def test_json_form_of_nonfinite_floats() -> None:
    value = {
        "a": [NAN, INF, -INF, 1.5],
        "m": {"deep": [{"x": -INF}]},
        "s": np.float32("nan"),
        "h": np.float16("-inf"),  # NumPy scalars travel as msgpack floats
    }
    form = to_jsonable(value)
    assert form == {
        "a": [{"$float": "NaN"}, {"$float": "Infinity"}, {"$float": "-Infinity"}, 1.5],
        "m": {"deep": [{"x": {"$float": "-Infinity"}}]},
        "s": {"$float": "NaN"},
        "h": {"$float": "-Infinity"},
    }
    assert spell_floats(msgpack_to_jsonable(packb(value))) == form
    back = from_jsonable(json.loads(json.dumps(form, allow_nan=False)))
    assert math.isnan(back["a"][0]) and back["a"][1:] == [INF, -INF, 1.5]
    assert back["m"] == {"deep": [{"x": -INF}]} and math.isnan(back["s"]) and back["h"] == -INF
    assert unpackb(jsonable_to_msgpack(form))["a"][1:] == [INF, -INF, 1.5]


def test_a_map_that_looks_like_a_float_tag_is_escaped() -> None:
    lookalike = {"$float": "NaN"}
    assert to_jsonable(lookalike) == {"$map": [["$float", "NaN"]]}
    assert msgpack_to_jsonable(packb(lookalike)) == {"$map": [["$float", "NaN"]]}
    assert from_jsonable(to_jsonable(lookalike)) == lookalike


@pytest.mark.parametrize(
    ("stored", "spelled"),
    [
        (b"\xca\x7f\xc0\x00\x00", "NaN"),  # float32
        (b"\xca\x7f\x80\x00\x00", "Infinity"),
        (b"\xca\xff\x80\x00\x00", "-Infinity"),
        (b"\xcb\x7f\xf8" + bytes(6), "NaN"),  # float64
        (b"\xcb\xff\xf0" + bytes(6), "-Infinity"),
        (b"\xcb\xff\xf8" + bytes(5) + b"\x01", "NaN"),  # negative, with a payload
    ],
)
def test_msgpack_floats_of_either_width_are_spelled(stored: bytes, spelled: str) -> None:
    form = spell_floats(msgpack_to_jsonable(b"\x81\xa1v\x91" + stored))
    assert form == {"v": [{"$float": spelled}]}


def test_spell_floats_keeps_finite_values_and_tags() -> None:
    form = {"a": [1.0, -0.0, 1e308, "NaN"], "b": {"$bytes": "AQ=="}, "c": (INF,), "d": True}
    assert spell_floats(form) == {
        "a": [1.0, -0.0, 1e308, "NaN"],
        "b": {"$bytes": "AQ=="},
        "c": [{"$float": "Infinity"}],
        "d": True,
    }
