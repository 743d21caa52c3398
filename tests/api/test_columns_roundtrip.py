"""Columns of every dtype the contract lists round-trip through the server bit-exactly, in
both layouts, against the per-item form (property-based, in-process)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import httpx
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlreplay.wire.arrays import BFloat16Array
from rlreplay.wire.codec import packb
from tests.api.test_columns import per_item, post, stored
from tests.wire.test_codec import DTYPES as FIXED_WIDTH_DTYPES

DTYPES = st.one_of(
    FIXED_WIDTH_DTYPES,
    st.just("bfloat16"),
)
_TABLES = itertools.count()


@st.composite
def columns(draw: st.DrawFn, n: int) -> Any:
    """A column of ``n`` items: arbitrary bits, in C, Fortran or a strided layout."""
    dtype = draw(DTYPES)
    element = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3))
    shape = (n, *element)
    itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    size = math.prod(shape) * itemsize
    raw = draw(st.binary(min_size=size, max_size=size))
    if dtype == "bfloat16":
        return BFloat16Array(np.frombuffer(raw, dtype=np.uint16).reshape(shape).copy())
    if np.dtype(dtype).kind == "b":
        array = (np.frombuffer(raw, np.uint8) & 1).astype(bool).reshape(shape)
    else:
        array = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if array.ndim == 1 and array.dtype.kind == "u" and array.itemsize == 8:
        array &= np.uint64(2**63 - 1)  # ints past int64 are refused (test_columns.py)
    layout = draw(st.sampled_from(["c", "fortran", "strided"]))
    if layout == "fortran":
        return np.asfortranarray(array)
    if layout == "strided" and array.ndim >= 2:
        doubled = np.repeat(array, 2, axis=-1)
        return doubled[..., ::2]  # the same values, not contiguous
    return array


@st.composite
def batches(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(min_value=1, max_value=4))
    names = draw(st.lists(st.sampled_from(["obs", "act", "r", "x.y", "é"]), min_size=1,
                          max_size=3, unique=True))  # fmt: skip
    return {name: draw(columns(n)) for name in names}


def expected_column(column: Any) -> Any:
    """What ``layout: "columns"`` answers for a column pushed as is."""
    if isinstance(column, BFloat16Array):
        return column
    if column.ndim >= 2:
        return np.ascontiguousarray(column)  # an array per item
    if column.dtype.kind == "c":  # a NumPy scalar per item, sent as a 0-d array of its own
        return np.array([np.asarray(x) for x in column])
    scalars = [x.item() for x in column]  # the codec sends a NumPy scalar as Python's
    if column.dtype.kind == "b":
        return np.array(scalars, dtype=bool)
    if column.dtype.kind == "f":
        return np.array(scalars, dtype="<f8")
    return np.array(scalars, dtype="<i8")


def assert_bits(got: Any, want: Any) -> None:
    if isinstance(want, BFloat16Array):
        assert isinstance(got, BFloat16Array) and got == want
        return
    assert isinstance(got, np.ndarray)
    assert (got.dtype.str, got.shape) == (want.dtype.str, want.shape)
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def rows(column: Any, index: list[int]) -> Any:
    if isinstance(column, BFloat16Array):
        return BFloat16Array(np.ascontiguousarray(column.bits[index]))
    return column[index]


@given(batch=batches(), fmt=st.sampled_from(["msgpack", "json"]))
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
async def test_columns_round_trip_bit_exactly_against_the_per_item_form(
    client: httpx.AsyncClient, batch: dict[str, Any], fmt: str
) -> None:
    n = next(iter(batch.values())).shape[0]
    keys = [f"k{i}" for i in range(n)]
    cols, per = f"cols{next(_TABLES)}", f"rows{next(_TABLES)}"
    for table in (cols, per):
        r = await client.put(f"/v1/tables/{table}", json={"sampler": {"type": "uniform"}})
        assert r.status_code == 201
    try:
        await check_round_trips(client, batch, fmt, keys, cols, per)
    finally:  # the server holds --max-tables tables at most
        for table in (cols, per):
            await client.delete(f"/v1/tables/{table}")


async def check_round_trips(
    client: httpx.AsyncClient, batch: dict[str, Any], fmt: str, keys: list[str], cols: str, per: str
) -> None:
    n = len(keys)
    status, answer = await post(
        client, f"/v1/tables/{cols}/items", {"keys": keys, "columns": batch, "wait": True}, fmt
    )
    assert status == 200, answer
    values = [per_item(batch, i) for i in range(n)]
    items = [{"key": k, "value": v} for k, v in zip(keys, values, strict=True)]
    await post(client, f"/v1/tables/{per}/items", {"items": items, "wait": True})

    # the per-item form's bytes, and its values back bit-exactly
    assert await stored(client, cols, keys) == [packb(v) for v in values]
    assert await stored(client, per, keys) == [packb(v) for v in values]
    _, got = await post(client, f"/v1/tables/{cols}/items:batchGet", {"keys": keys}, fmt)
    for item, value in zip(got["items"], values, strict=True):
        for name, element in value.items():
            if isinstance(element, np.ndarray | BFloat16Array):
                assert_bits(item["value"][name], element)

    # the columns layout: each field stacked, bit-exactly
    want = {name: expected_column(column) for name, column in batch.items()}
    for table in (cols, per):
        body = {"keys": keys[::-1], "layout": "columns"}
        status, got = await post(client, f"/v1/tables/{table}/items:batchGet", body, fmt)
        assert status == 200, got
        assert list(got["columns"]) == list(batch)
        for name, column in want.items():
            assert_bits(got["columns"][name], rows(column, list(range(n))[::-1]))
    status, sample = await post(
        client, f"/v1/tables/{cols}/sample", {"batch_size": n, "layout": "columns"}, fmt
    )
    assert status == 200, sample
    picked = [keys.index(key) for key in sample["keys"]]
    for name, column in want.items():
        assert_bits(sample["columns"][name], rows(column, picked))
