"""The client end to end against a real server process on 127.0.0.1."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlreplay.clients import (
    BFloat16Array,
    DeadlineExceeded,
    ReplayClient,
    TableExists,
    TableNotFound,
    Unauthorized,
    ValidationFailed,
)
from tests.live import running_server

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("live")) as server:
        yield server.url


@pytest.fixture
async def rb(server_url: str) -> AsyncIterator[ReplayClient]:
    async with ReplayClient(server_url, backoff_s=0.01, max_backoff_s=0.05) as client:
        yield client


def table_name(request: pytest.FixtureRequest) -> str:
    return "t_" + request.node.name.replace("[", "_").replace("]", "").replace("-", "_")


def bit_pattern(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Arrays of every byte value in order (NaN payloads, -0.0, subnormals for floats)."""
    dt = np.dtype(dtype)
    size = math.prod(shape) * dt.itemsize
    raw = (np.arange(size, dtype=np.uint64) * 37 + 11).astype(np.uint8).tobytes()
    if dt.kind == "b":
        return (np.frombuffer(raw, np.uint8) & 1).astype(bool).reshape(shape)
    return np.frombuffer(raw, dtype=dt).reshape(shape).copy()


ARRAYS = {
    "f4": bit_pattern("<f4", (3, 4)),
    "f8_be": bit_pattern(">f8", (2, 2)),
    "f2": bit_pattern("<f2", (5,)),
    "i8": bit_pattern("<i8", (2, 3)),
    "u1": bit_pattern("|u1", (4, 4, 3)),
    "b1": bit_pattern("|b1", (7,)),
    "c8": bit_pattern("<c8", (2,)),
    "scalar": np.array(-0.0, dtype="<f4"),
    "empty": np.zeros((0, 5), dtype="<i4"),
    "nan_payload": np.array([0x7FC00001, 0xFFFFFFFF], dtype="<u4").view("<f4"),
    "strided": bit_pattern("<f4", (6, 4))[::2, ::-1],
}


def assert_same_array(got: Any, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype.str == want.dtype.str and got.shape == want.shape
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


async def test_numpy_arrays_round_trip_bit_exactly(
    rb: ReplayClient, request: pytest.FixtureRequest
) -> None:
    table = table_name(request)
    await rb.create_table(table, sampler={"type": "uniform"})
    value = {"arrays": ARRAYS, "reward": 1.5, "raw": b"\x00\xff", "ints": {1: "one"}}
    assert await rb.push(table, [{"key": "k", "value": value, "priority": 2.0}]) == 1
    item = await rb.get(table, "k")  # read-your-writes, even before the writer applied it
    assert item is not None and item["key"] == "k" and item["priority"] == 2.0
    assert item["times_sampled"] == 0 and item["inserted_at"] > 0
    got = item["value"]
    assert got["reward"] == 1.5 and got["raw"] == b"\x00\xff" and got["ints"] == {1: "one"}
    for name, want in ARRAYS.items():
        assert_same_array(got["arrays"][name], want)
    (sampled,) = await rb.sample(table, batch_size=1)
    for name, want in ARRAYS.items():
        assert_same_array(sampled["value"]["arrays"][name], want)


TENSOR_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


async def test_torch_tensors_round_trip_bit_exactly(
    rb: ReplayClient, request: pytest.FixtureRequest
) -> None:
    table = table_name(request)
    await rb.create_table(table)
    tensors = {}
    for dtype in TENSOR_DTYPES:
        raw = torch.arange(24, dtype=torch.int64).mul(97).remainder(256).to(torch.uint8)
        if dtype == torch.bool:
            tensors[str(dtype)] = (raw % 2).bool().reshape(4, 6)
            continue
        itemsize = torch.empty((), dtype=dtype).element_size()
        tensors[str(dtype)] = raw.repeat(itemsize).view(dtype).reshape(4, 6)
    tensors["transposed"] = torch.randn(3, 5).T
    tensors["nan"] = torch.tensor([float("nan"), -0.0, float("-inf")])
    await rb.push(table, [{"key": "t", "value": tensors}], wait=True)
    item = await rb.get(table, "t")
    assert item is not None
    for name, want in tensors.items():
        got = item["value"][name]
        back = got.to_torch() if isinstance(got, BFloat16Array) else torch.from_numpy(got)
        assert back.dtype == want.dtype and back.shape == want.shape, name
        if want.dtype == torch.bool:
            assert torch.equal(back, want)
            continue
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        if want.is_complex():
            back, want = torch.view_as_real(back), torch.view_as_real(want)
        as_int = width[want.element_size()]
        assert torch.equal(back.contiguous().view(as_int), want.contiguous().view(as_int)), name


async def test_the_item_api(rb: ReplayClient, request: pytest.FixtureRequest) -> None:
    table = table_name(request)
    created = await rb.create_table(table, sampler={"type": "uniform"}, max_size=100)
    assert created["name"] == table
    await rb.create_table(table, sampler={"type": "uniform"}, max_size=100)  # same: fine
    with pytest.raises(TableExists):
        await rb.create_table(table, sampler={"type": "fifo"}, max_size=100)
    assert table in {t["name"] for t in await rb.list_tables()}

    keys = ["plain", "with/slash", "q?x=1#f", "100%", "sp ace", "ünï", "..", "a:b"]
    items = [{"key": k, "value": {"k": k}, "priority": 1.0 + i} for i, k in enumerate(keys)]
    assert await rb.push(table, items, wait=True) == len(keys)
    for key in keys:
        item = await rb.get(table, key)
        assert item is not None and item["key"] == key and item["value"] == {"k": key}
    assert await rb.get(table, "missing") is None
    got = await rb.get_many(table, ["with/slash", "missing", "plain"])
    assert [g and g["key"] for g in got] == ["with/slash", None, "plain"]

    batch = await rb.sample(table, batch_size=16)
    assert len(batch) == 16 and {b["key"] for b in batch} <= set(keys)
    assert all({"key", "value", "priority", "probability", "weight"} <= set(b) for b in batch)
    bare = await rb.sample(table, batch_size=4, include_values=False)
    assert all("value" not in b or b["value"] is None for b in bare)

    updated = await rb.update_priorities(table, {"plain": 9.0, "missing": 1.0})
    assert updated == {"updated": 1, "missing": 1}
    assert (await rb.get(table, "plain") or {})["priority"] == 9.0

    assert await rb.delete(table, ["plain", "with/slash"]) == 2
    assert await rb.get(table, "plain") is None
    assert (await rb.describe_table(table))["stats"]["size"] in (len(keys) - 2, len(keys))

    with pytest.raises(ValidationFailed):
        await rb.sample(table, batch_size=0)
    with pytest.raises(ValidationFailed):
        await rb.push(table, [{"key": "neg", "value": 1, "priority": -1.0}])
    await rb.drop_table(table)
    with pytest.raises(TableNotFound):
        await rb.get(table, "plain")


async def test_sample_waits_then_raises_deadline_exceeded(
    rb: ReplayClient, request: pytest.FixtureRequest
) -> None:
    table = table_name(request)
    await rb.create_table(table, rate_limiter={"type": "min_size", "min_size": 5})
    await rb.push(table, [{"key": "only", "value": 1}])
    with pytest.raises(DeadlineExceeded):
        await rb.sample(table, batch_size=1, timeout_ms=100)


async def test_stream_yields_batches(rb: ReplayClient, request: pytest.FixtureRequest) -> None:
    table = table_name(request)
    await rb.create_table(table, sampler={"type": "uniform"})
    await rb.push(table, [{"key": f"k{i}", "value": np.full(8, i)} for i in range(32)])
    batches = 0
    async with aclosing(rb.stream(table, batch_size=8, prefetch=4)) as stream:
        async for batch in stream:
            assert len(batch) == 8
            for item in batch:
                assert item["value"].tolist() == [int(item["key"][1:])] * 8
            batches += 1
            if batches == 20:
                break
    assert await rb.health() is True


async def test_api_keys_are_sent(tmp_path: Path) -> None:
    with running_server(tmp_path, "--api-key", "s3cret") as server:
        url = server.url
        async with ReplayClient(url, retries=0) as anonymous:
            assert await anonymous.health() is True  # /healthz stays open
            with pytest.raises(Unauthorized):
                await anonymous.list_tables()
        async with ReplayClient(url, api_key="s3cret") as rb:
            assert "default" in {t["name"] for t in await rb.list_tables()}
