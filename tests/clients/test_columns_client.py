"""The client's columnar calls against the server: push_columns, sample, get_many and
stream with ``layout="columns"``, and a columnar push surviving ``kill -9``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from rlreplay.clients import BFloat16Array, ColumnBatch, ReplayClient, ValidationFailed
from tests.live import running_server

pytest.importorskip("fastapi")

from rlreplay.app.main import create_app
from rlreplay.app.settings import Settings


@pytest.fixture
async def rb(tmp_path: Path) -> AsyncIterator[ReplayClient]:
    """A client of an in-process server (memory mode)."""
    app = create_app(Settings(data_dir=tmp_path / "data", storage_mode="memory"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with ReplayClient("http://testserver", transport=transport) as client:
            yield client


def batch_columns(n: int) -> dict[str, object]:
    return {
        "obs": np.arange(n * 6, dtype=">f4").reshape(n, 2, 3),  # big-endian
        "reward": np.linspace(0, 1, n),
        "action": torch.arange(n, dtype=torch.int16).reshape(n, 1),
        "logits": torch.linspace(-1, 1, n * 2, dtype=torch.bfloat16).reshape(n, 2),
    }


async def test_push_columns_reads_back_as_per_item_values(rb: ReplayClient) -> None:
    await rb.create_table("t", sampler={"type": "fifo"})
    columns = batch_columns(4)
    keys = [f"k{i}" for i in range(4)]
    pushed = await rb.push_columns("t", keys, columns, priorities=np.arange(4.0), wait=True)
    assert pushed == 4
    item = await rb.get("t", "k2")
    assert item is not None and item["priority"] == 2.0
    obs = columns["obs"]
    assert isinstance(obs, np.ndarray)
    assert item["value"]["obs"].dtype.str == ">f4" and np.array_equal(item["value"]["obs"], obs[2])
    assert item["value"]["reward"] == pytest.approx(2 / 3)
    assert item["value"]["action"].tolist() == [2]
    assert isinstance(item["value"]["logits"], BFloat16Array)
    assert await rb.push_columns("t", [], {"obs": np.zeros((0, 2))}) == 0


async def test_columnar_reads_give_column_batches(rb: ReplayClient) -> None:
    await rb.create_table("t", sampler={"type": "uniform"})
    columns = batch_columns(4)
    keys = [f"k{i}" for i in range(4)]
    await rb.push_columns("t", keys, columns, wait=True)

    got = await rb.get_many("t", ["k3", "nope", "k1"], layout="columns")
    assert isinstance(got, ColumnBatch)
    assert got.keys == ["k3", "k1"] and got.missing == ["nope"] and len(got) == 2
    assert got.probabilities is None and got.weights is None
    obs = columns["obs"]
    assert isinstance(obs, np.ndarray)
    assert got["obs"].dtype.str == ">f4" and np.array_equal(got["obs"], obs[[3, 1]])
    assert got["reward"].dtype.str == "<f8"

    sample = await rb.sample("t", 8, layout="columns")
    assert isinstance(sample, ColumnBatch) and len(sample) == 8
    assert sample.weights is not None and sample.weights.tolist() == [1.0] * 8
    assert sample.probabilities is not None and sample.probabilities.tolist() == [0.25] * 8
    rows = [keys.index(key) for key in sample.keys]
    assert np.array_equal(sample["obs"], obs[rows])

    tensors = sample.as_torch()
    assert tensors["action"].dtype == torch.int16
    assert tensors["action"].data_ptr() == sample["action"].ctypes.data  # shares memory
    assert tensors["obs"].dtype == torch.float32  # made native: torch holds no other
    assert torch.equal(tensors["obs"], torch.from_numpy(obs[rows].astype("<f4")))
    logits = columns["logits"]
    assert isinstance(logits, torch.Tensor)
    assert tensors["logits"].dtype == torch.bfloat16
    assert torch.equal(tensors["logits"], logits[rows])


async def test_stream_yields_column_batches(rb: ReplayClient) -> None:
    await rb.create_table("t", sampler={"type": "uniform"})
    await rb.push_columns("t", ["a", "b"], {"x": np.array([[1], [2]])}, wait=True)
    seen = 0
    async with aclosing(rb.stream("t", batch_size=3, prefetch=2, layout="columns")) as batches:
        async for batch in batches:
            assert isinstance(batch, ColumnBatch) and batch["x"].shape == (3, 1)
            seen += 1
            if seen == 3:
                break


async def test_columnar_errors_name_the_field(rb: ReplayClient) -> None:
    await rb.create_table("t", sampler={"type": "fifo"}, max_times_sampled=1)
    with pytest.raises(ValidationFailed, match="obs"):
        await rb.push_columns("t", ["a", "b"], {"obs": np.zeros((3, 2))})
    await rb.push("t", [{"key": "a", "value": {"x": 1}}, {"key": "b", "value": {"x": "s"}}])
    with pytest.raises(ValidationFailed, match="'x'"):
        await rb.sample("t", 2, layout="columns")
    with pytest.raises(ValidationFailed, match="'x'"):
        await rb.get_many("t", ["a", "b"], layout="columns")


async def test_a_columnar_push_survives_kill_9(tmp_path: Path) -> None:
    columns = batch_columns(3)
    keys = ["a", "b", "c"]
    with running_server(tmp_path) as server:
        async with ReplayClient(server.url) as rb:
            await rb.push_columns("default", keys, columns, priorities=[1.0, 2.0, 3.0])
            before = await rb.get_many("default", keys, layout="columns")
        server.process.kill()
        server.process.wait(10)
    with running_server(tmp_path) as server:
        async with ReplayClient(server.url) as rb:
            after = await rb.get_many("default", keys, layout="columns")
    assert after.keys == keys and after.priorities.tolist() == [1.0, 2.0, 3.0]
    for name, column in before.columns.items():
        assert type(after[name]) is type(column)
        if isinstance(column, BFloat16Array):
            assert after[name] == column
        else:
            assert after[name].dtype.str == column.dtype.str
            assert after[name].tobytes() == column.tobytes()
