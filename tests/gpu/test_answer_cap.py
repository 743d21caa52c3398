"""Every answer of the sidecar is capped before it is built: a small request for many picks
of large items is refused with the server's 422, before memory is taken for the batch, and
the size it reckons is the size it would have built."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator

import httpx
import msgpack
import numpy as np
import pytest
import torch

from rlreplay import GpuSampler
from rlreplay.clients import ReplayClient
from rlreplay.gpu.collection import BatchTooLarge, Collector
from rlreplay.gpu.service import SidecarConfig, create_sidecar_app
from tests.gpu.test_sampler import value_of

MB = 1 << 20
#: One item's "obs": 4096 float32, 16 KiB.
OBS_BYTES = 16 << 10


async def push_big(rb: ReplayClient, table: str, n: int = 4) -> None:
    await rb.create_table(table, sampler={"type": "uniform"})
    items = [
        {"key": f"b{i}", "value": {"obs": np.full(OBS_BYTES // 4, i, dtype=np.float32)}}
        for i in range(n)
    ]
    await rb.push(table, items, wait=True)


async def test_a_refused_batch_takes_no_memory_for_its_picks(rb: ReplayClient) -> None:
    """8,192 picks of a 16 KiB field reckon 128 MiB: refused with a few KiB allocated."""
    await push_big(rb, "big")
    keys = [f"b{i}" for i in range(4)]
    packed = await rb.get_many_packed("big", keys)
    collector = Collector(rb, "big", torch.device("cpu"))
    picks = np.arange(8192, dtype=np.int64) % 4
    tracemalloc.start()
    try:
        with pytest.raises(BatchTooLarge) as refused:
            collector.place(packed, picks, ["obs"], limit=MB, reserved=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.nbytes == 8192 * OBS_BYTES
    assert refused.value.status == 422 and refused.value.code == "validation_error"
    assert peak < MB, peak
    assert collector.bytes_collected == 0


@pytest.mark.parametrize("batch_size", [7, 300])  # distinct picks, and repeated ones
async def test_the_size_reckoned_is_the_size_built(rb: ReplayClient, batch_size: int) -> None:
    """A limit of exactly the batch's bytes passes, one byte less is refused (a fixed-shape
    field, a packed variable-length one with its cu_seqlens, a scalar)."""
    await rb.create_table("c", sampler={"type": "uniform"})
    pushed = {f"c{i}": value_of(i) for i in range(40)}
    await rb.push("c", [{"key": k, "value": v} for k, v in pushed.items()], wait=True)
    fields = ["obs", "tokens", "reward"]
    async with GpuSampler(rb, "c", seed=5) as free:
        batch = await free.sample(batch_size, fields=fields, seed=11)
    built = sum(map(len, batch.keys)) + 16 * batch_size
    built += sum(t.numel() * t.element_size() for t in batch.columns.values())
    async with GpuSampler(rb, "c", max_batch_bytes=built) as exact:
        same = await exact.sample(batch_size, fields=fields, seed=11)
        assert same.keys == batch.keys
    async with GpuSampler(rb, "c", max_batch_bytes=built - 1) as short:
        with pytest.raises(BatchTooLarge) as refused:
            await short.sample(batch_size, fields=fields, seed=11)
        assert refused.value.nbytes == built
        assert short.collector.bytes_collected == 0


async def test_keys_alone_past_the_limit_are_refused_before_any_fetch(rb: ReplayClient) -> None:
    await rb.create_table("k", sampler={"type": "uniform"})
    await rb.push("k", [{"key": "k" * 200, "value": 1}], wait=True)
    async with GpuSampler(rb, "k", max_batch_bytes=MB) as sampler:
        with pytest.raises(BatchTooLarge, match="a sample of 65536 picks"):
            await sampler.sample(65_536)
        assert sampler.collector.bytes_collected == 0
        assert len((await sampler.sample(100)).keys) == 100


@pytest.fixture
async def capped(rb: ReplayClient) -> AsyncIterator[httpx.AsyncClient]:
    config = SidecarConfig("http://unused", "big", "cpu", retry_s=0.02, max_response_bytes=MB)
    app = create_sidecar_app(config, client=rb)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as c:
            yield c


async def test_the_sidecar_answers_422_past_max_response_mb(
    rb: ReplayClient, capped: httpx.AsyncClient
) -> None:
    """A 40-byte request for 8,192 picks of 16 KiB: the server's 422 body, naming the flag."""
    await push_big(rb, "big")
    for _ in range(1000):
        if (await capped.get("/readyz")).status_code == 200:
            break
        await asyncio.sleep(0.01)
    request = msgpack.packb({"batch_size": 8192, "fields": ["obs"]})
    assert len(request) < 40
    headers = {"content-type": "application/msgpack"}
    r = await capped.post("/v1/sample", content=request, headers=headers)
    assert r.status_code == 422, r.content
    error = r.json()["error"]
    assert error["code"] == "validation_error"
    assert "--max-response-mb (1)" in error["message"] and "ask for fewer" in error["message"]
    small = msgpack.packb({"batch_size": 32, "fields": ["obs"]})
    assert (await capped.post("/v1/sample", content=small, headers=headers)).status_code == 200
