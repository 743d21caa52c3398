"""The async client on an episode table of a real app (in process): appends read back bit
for bit, retried appends applied once, the contract's errors as exceptions, windows and n-step
returns sampled and streamed, window priorities set, the episode writer's many episodes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from rlreplay import ReplayClient, StepConflict, TableNotFound, ValidationFailed, WindowBatch
from rlreplay.app.main import create_app
from rlreplay.app.settings import Settings
from rlreplay.wire.codec import unpackb


class LoseFirstAppendAnswer(httpx.AsyncBaseTransport):
    """Passes requests to the app; the first append's answer is lost after the app took it."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.request_ids: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/steps"):
            self.request_ids.append(unpackb(request.content)["request_id"])
            if len(self.request_ids) == 1:
                await response.aread()
                raise httpx.ReadError("the answer was lost", request=request)
        return response


@pytest.fixture
async def transport(tmp_path: Path) -> AsyncIterator[LoseFirstAppendAnswer]:
    app = create_app(Settings(data_dir=tmp_path / "data", storage_mode="memory"))
    async with app.router.lifespan_context(app):
        yield LoseFirstAppendAnswer(httpx.ASGITransport(app=app))


@pytest.fixture
async def rb(transport: LoseFirstAppendAnswer) -> AsyncIterator[ReplayClient]:
    async with ReplayClient(
        "http://replay.test", transport=transport, backoff_s=0.001, max_backoff_s=0.002
    ) as client:
        yield client


def steps(k: int, offset: int = 0, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.integers(0, 255, size=(k, 3, 2), dtype=np.uint8),
        "action": np.arange(offset, offset + k, dtype=np.int64),
        "reward": rng.random(k).astype(np.float32),
    }


def joined(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


async def test_appends_read_back_and_a_retry_applies_once(
    rb: ReplayClient, transport: LoseFirstAppendAnswer
) -> None:
    await rb.create_table("eps", episodes={})
    first, second = steps(4, 0, seed=1), steps(3, 4, seed=2)
    assert await rb.append_steps("eps", "ep-1", first, start=0) == 4  # answered on retry
    assert transport.request_ids[0] == transport.request_ids[1]
    final = {"obs": np.full((3, 2), 9, np.uint8), "action": np.int64(0), "reward": 0.0}
    await rb.append_steps("eps", "ep-1", second, start=4, end="truncated", final=final, wait=True)
    assert len(set(transport.request_ids)) == 2  # a fresh id per append
    episode = await rb.get_episode("eps", "ep-1")
    assert episode is not None
    assert (episode.length, episode.end, len(episode)) == (7, "truncated", 7)
    for name, column in joined([first, second]).items():
        np.testing.assert_array_equal(episode.steps[name], column)
    assert episode.final is not None
    np.testing.assert_array_equal(episode.final["obs"], final["obs"])
    part = await rb.get_episode("eps", "ep-1", start=2, stop=5)
    assert part is not None and (part.start, part.length, len(part)) == (2, 7, 3)
    np.testing.assert_array_equal(part.steps["action"], [2, 3, 4])
    assert await rb.get_episode("eps", "nobody") is None
    await rb.delete_episode("eps", "ep-1")
    assert await rb.get_episode("eps", "ep-1") is None


async def test_the_contracts_errors_arrive_as_exceptions(rb: ReplayClient) -> None:
    await rb.create_table("eps", episodes={})
    await rb.append_steps("eps", "ep-1", steps(2), start=0)
    with pytest.raises(StepConflict, match="2"):
        await rb.append_steps("eps", "ep-1", steps(1), start=5)
    with pytest.raises(ValidationFailed, match="obs"):
        bad = steps(1)
        bad["obs"] = bad["obs"].astype(np.float32)
        await rb.append_steps("eps", "ep-1", bad, start=2)
    with pytest.raises(ValidationFailed, match="first axes"):  # said before sending
        await rb.append_steps("eps", "ep-1", {"obs": np.zeros((2, 1)), "r": [1]}, start=2)
    with pytest.raises(TableNotFound):
        await rb.append_steps("nowhere", "ep-1", steps(1), start=0)
    await rb.append_steps("eps", "ep-1", {}, start=2, end="terminated")
    with pytest.raises(StepConflict):
        await rb.append_steps("eps", "ep-1", steps(1), start=2)


def nstep_reference(
    rewards: np.ndarray, t: int, n: int, gamma: float, terminated: bool
) -> tuple[float, float]:
    length = len(rewards)
    m = min(n, length - t)
    ret = sum(gamma**j * float(rewards[t + j]) for j in range(m))
    return ret, (0.0 if terminated and t + m == length else gamma**m)


async def test_windows_and_n_step_returns(rb: ReplayClient) -> None:
    await rb.create_table("eps", episodes={})
    data = steps(10, seed=3)
    await rb.append_steps("eps", "ep-1", data, start=0, end="terminated")
    batch = await rb.sample("eps", 32, length=4, burn_in=1, fields=["obs", "action"])
    assert isinstance(batch, WindowBatch)
    assert batch["obs"].shape == (32, 5, 3, 2) and set(batch.columns) == {"obs", "action"}
    assert batch.mask.all() and batch.returns is None
    for b, start in enumerate(batch.starts.tolist()):
        assert 0 <= start <= 5 and batch.episodes[b] == "ep-1"
        np.testing.assert_array_equal(batch["action"][b], np.arange(start, start + 5))
    np.testing.assert_allclose(batch.probabilities, 1 / 6)

    gamma = 0.9
    batch = await rb.sample("eps", 64, n_step=3, gamma=gamma, next_fields=["obs"])
    assert batch.returns is not None and batch.discount is not None
    for b, start in enumerate(batch.starts.tolist()):
        ret, disc = nstep_reference(data["reward"], start, 3, gamma, terminated=True)
        assert batch.returns[b, 0] == pytest.approx(ret)
        assert batch.discount[b, 0] == pytest.approx(disc)
        if start + 3 < 10:
            np.testing.assert_array_equal(batch.next["obs"][b, 0], data["obs"][start + 3])

    padded = await rb.sample("eps", 16, length=4, pad=True, start_every=4)
    assert set(padded.starts.tolist()) <= {0, 4, 8}
    for b, start in enumerate(padded.starts.tolist()):
        assert padded.mask[b].tolist() == [start + w < 10 for w in range(4)]


async def test_a_window_stream_keeps_yielding_batches(rb: ReplayClient) -> None:
    await rb.create_table("eps", episodes={})
    await rb.append_steps("eps", "ep-1", steps(6), start=0)
    seen = 0
    async with aclosing(rb.stream("eps", batch_size=4, prefetch=2, length=3)) as batches:
        async for batch in batches:
            assert isinstance(batch, WindowBatch) and batch["obs"].shape == (4, 3, 3, 2)
            seen += 1
            if seen == 3:
                break
    with pytest.raises(TypeError, match="layout"):
        await rb.sample("eps", 4, length=2, layout="columns")  # type: ignore[call-overload]


async def test_window_priorities_given_or_mixed_from_td_errors(rb: ReplayClient) -> None:
    await rb.create_table("eps", episodes={}, sampler={"type": "prioritized", "exponent": 1.0})
    await rb.append_steps("eps", "ep-1", steps(6), start=0, priorities=[1.0] * 6)
    zeros = [("ep-1", s, 0.0) for s in range(5)]
    assert await rb.update_window_priorities("eps", [*zeros, ("ep-1", 9, 1.0)]) == {
        "updated": 5,
        "missing": 1,
    }
    answer = await rb.update_window_priorities("eps", [("ep-1", 3, [1.0, -3.0])], eta=0.5)
    assert answer == {"updated": 1, "missing": 0}
    batch = await rb.sample("eps", 16, length=2)
    assert batch.starts.tolist() == [3] * 16
    np.testing.assert_allclose(batch.priorities, 0.5 * 3.0 + 0.5 * 2.0)


async def test_the_episode_writer_keeps_many_episodes_in_order(rb: ReplayClient) -> None:
    await rb.create_table("eps", episodes={})
    expected: dict[str, list[dict[str, np.ndarray]]] = {f"ep-{i}": [] for i in range(5)}
    async with rb.episode_writer("eps", max_in_flight=4) as w:
        for t in range(6):
            for i, name in enumerate(expected):
                part = steps(1 + (t + i) % 3, sum(len(p["action"]) for p in expected[name]), t)
                expected[name].append(part)
                await w.append(name, part)
        for i, name in enumerate(expected):
            if i % 2:
                await w.end(name, "terminated")
            else:
                last = {field: column[0] for field, column in steps(1).items()}
                await w.end(name, "truncated", final=last)
    total = 0
    for i, (name, parts) in enumerate(expected.items()):
        episode = await rb.get_episode("eps", name)
        assert episode is not None and episode.end == ("terminated" if i % 2 else "truncated")
        for field, column in joined(parts).items():
            np.testing.assert_array_equal(episode.steps[field], column)
        total += episode.length
    assert w.appended == total


async def test_the_episode_writer_raises_the_servers_error(rb: ReplayClient) -> None:
    await rb.create_table("eps", episodes={})
    await rb.append_steps("eps", "ep-1", steps(2), start=0)
    with pytest.raises(StepConflict):
        async with rb.episode_writer("eps") as w:
            await w.append("ep-1", steps(1))  # the writer numbers from 0: a conflict
    info: dict[str, Any] = await rb.describe_table("eps")
    assert info["stats"]["steps"] == 2
