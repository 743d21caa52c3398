"""Answers in the items layout are read into the client's reused buffers and their arrays
handed out as views of them, as columnar answers are: bit-exact in every dtype over TCP and
the Unix socket, never overwritten while the caller holds them, and reused once it does not."""

from __future__ import annotations

import gc
import itertools
import math
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlreplay import ReplayClient
from rlreplay.wire.arrays import BFloat16Array
from tests.clients.uds_server import live_uds  # noqa: F401  (a fixture)
from tests.live import LiveServer
from tests.wire.test_codec import DTYPES

pytest.importorskip("fastapi")

ROWS, WIDTH = 8, 512 * 1024  # values past 64 KiB (sent as they lie), answers past 256 KiB
_TABLES = itertools.count()


@pytest.fixture(params=["tcp", "unix"])
async def rb(
    request: pytest.FixtureRequest,
    live_uds: tuple[LiveServer, str],  # noqa: F811
) -> AsyncIterator[ReplayClient]:
    server, sock_url = live_uds
    url = server.url if request.param == "tcp" else sock_url
    async with ReplayClient(url, timeout_s=60) as client:
        yield client


def _buffer_of(array: np.ndarray) -> Any:
    """The object at the end of ``array``'s ``base`` chain (what its memory belongs to)."""
    owner: Any = array
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    return owner.obj if isinstance(owner, memoryview) else owner


def _pooled(rb: ReplayClient) -> list[bytearray]:
    return rb._requester._lean._buffers._buffers  # type: ignore[union-attr]


async def _fill(rb: ReplayClient, table: str, value: int) -> list[str]:
    await rb.create_table(table)
    keys = [f"{table}-{i}" for i in range(ROWS)]
    items = [{"key": k, "value": {"x": np.full(WIDTH, value, np.uint8)}} for k in keys]
    await rb.push(table, items, wait=True)
    return keys


async def test_a_held_items_answer_is_never_overwritten_by_later_answers(
    rb: ReplayClient,
) -> None:
    held_table, other_table = f"held{next(_TABLES)}", f"other{next(_TABLES)}"
    held_keys = await _fill(rb, held_table, 7)
    other_keys = await _fill(rb, other_table, 9)
    held = await rb.get_many(held_table, held_keys)
    assert isinstance(held, list)
    arrays = [item["value"]["x"] for item in held if item is not None]
    owner = _buffer_of(arrays[0])
    assert any(owner is buf for buf in _pooled(rb))  # a view of a receive buffer
    assert all(_buffer_of(array) is owner for array in arrays)  # one buffer, no copies
    for _ in range(12):  # more answers than the pool keeps buffers
        other = await rb.get_many(other_table, other_keys)
        assert all((item["value"]["x"] == 9).all() for item in other)  # type: ignore[index]
        sampled = await rb.sample(other_table, ROWS)
        assert all((item["value"]["x"] == 9).all() for item in sampled)  # type: ignore[index]
    assert all((array == 7).all() for array in arrays)
    arrays[0][0] = 1  # the caller's to write
    assert arrays[0][0] == 1 and arrays[1][0] == 7


async def test_a_released_items_answer_s_buffer_is_reused(rb: ReplayClient) -> None:
    table = f"reuse{next(_TABLES)}"
    keys = await _fill(rb, table, 3)
    first = await rb.sample(table, ROWS)
    owner = id(_buffer_of(first[0]["value"]["x"]))  # type: ignore[index]
    del first
    gc.collect()
    again = await rb.sample(table, ROWS)
    assert id(_buffer_of(again[0]["value"]["x"])) == owner  # type: ignore[index]
    assert all((item["value"]["x"] == 3).all() for item in again)  # type: ignore[index]
    assert len(keys) == ROWS


@st.composite
def values(draw: st.DrawFn) -> dict[str, Any]:
    """A value of arbitrary bits in one dtype, with (first or last) or without a large
    field, so that the answer goes out in pieces or joined."""
    dtype = draw(st.one_of(DTYPES, st.just("bfloat16")))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    size = math.prod(shape) * itemsize
    raw = draw(st.binary(min_size=size, max_size=size))
    array: Any
    if dtype == "bfloat16":
        array = BFloat16Array(np.frombuffer(raw, np.uint16).reshape(shape).copy())
    elif np.dtype(dtype).kind == "b":
        array = (np.frombuffer(raw, np.uint8) & 1).astype(bool).reshape(shape)
    else:
        array = np.frombuffer(raw, dtype).reshape(shape).copy()
    large = np.arange(70_000, dtype=np.uint8)
    where = draw(st.sampled_from(["none", "first", "last"]))
    if where == "first":
        return {"big": large, "a": array}
    if where == "last":
        return {"a": array, "big": large}
    return {"a": array}


def _assert_bits(got: Any, want: Any) -> None:
    if isinstance(want, BFloat16Array):
        assert isinstance(got, BFloat16Array) and got == want
        return
    assert isinstance(got, np.ndarray)
    assert (got.dtype.str, got.shape) == (want.dtype.str, want.shape)
    assert got.tobytes() == want.tobytes()


@given(batch=st.lists(values(), min_size=1, max_size=4))
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
async def test_items_round_trip_bit_exactly_as_views(
    rb: ReplayClient, batch: list[dict[str, Any]]
) -> None:
    table = f"bits{next(_TABLES)}"
    keys = [f"k{'x' * i}{i}" for i in range(len(batch))]  # keys of several lengths
    await rb.create_table(table)
    try:
        await rb.push(table, [{"key": k, "value": v} for k, v in zip(keys, batch, strict=True)])
        got = await rb.get_many(table, [*keys, "missing"])
        assert isinstance(got, list) and got[-1] is None
        sampled = await rb.sample(table, 2 * len(keys))
        want = dict(zip(keys, batch, strict=True))
        answers = [item for item in got if item is not None] + list(sampled)
        assert len(answers) == 3 * len(keys)
        for answer in answers:
            value = want[answer["key"]]  # type: ignore[index]
            assert answer["value"].keys() == value.keys()  # type: ignore[index]
            for name, array in value.items():
                _assert_bits(answer["value"][name], array)  # type: ignore[index]
    finally:
        await rb.drop_table(table)
