"""``GpuSampler`` in process: selection on the device follows the server's distributions
(the same chi-square bar as the server's samplers), weights are the server's formula, and
collected columns equal the pushed values by key, ``cu_seqlens`` packing included."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from rlreplay import GpuSampler
from rlreplay.clients import ReplayClient
from rlreplay.gpu.device_index import DeviceIndex
from rlreplay.gpu.selection import Selector

P_MIN = 1e-4
DRAWS = 200_000

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def assert_follows(counts: Counter[str], expected: dict[str, float]) -> None:
    assert set(counts) <= {k for k, p in expected.items() if p > 0}, set(counts) - set(expected)
    keys = sorted(k for k, p in expected.items() if p > 0)
    observed = np.array([counts.get(k, 0) for k in keys], dtype=np.float64)
    wanted = np.array([expected[k] for k in keys]) * observed.sum()
    result = chisquare(observed, wanted)
    assert result.pvalue > P_MIN, (result, dict(zip(keys, observed.tolist(), strict=True)))


async def draw(sampler: GpuSampler, strategy: Any, total: int = DRAWS) -> tuple[Counter[str], Any]:
    counts: Counter[str] = Counter()
    first = None
    while sum(counts.values()) < total:
        batch = await sampler.sample(4096, strategy=strategy)
        counts.update(batch.keys)
        first = first or batch
    return counts, first


async def test_prioritized_follows_priorities_after_updates_and_deletes(rb: ReplayClient) -> None:
    alpha, beta = 0.6, 0.4
    await rb.create_table(
        "p", sampler={"type": "prioritized", "exponent": alpha, "is_exponent": beta}
    )
    prios = {f"k{i}": float(i) for i in range(12)}  # k0: priority 0, never drawn
    await rb.push("p", [{"key": k, "value": 0, "priority": p} for k, p in prios.items()], wait=True)
    async with GpuSampler(rb, "p", seed=3) as sampler:

        def expected() -> dict[str, float]:
            mass = {k: p**alpha if p > 0 else 0.0 for k, p in prios.items()}
            return {k: m / sum(mass.values()) for k, m in mass.items()}

        async def check() -> None:
            counts, batch = await draw(sampler, "prioritized")
            want = expected()
            assert_follows(counts, want)
            probs = batch.probabilities.cpu().tolist()
            for key, p in zip(batch.keys, probs, strict=True):
                assert p == pytest.approx(want[key], rel=1e-9)
            raw = [(len(prios) * p) ** -beta for p in probs]
            weights = batch.weights.cpu().tolist()
            assert weights == pytest.approx([w / max(raw) for w in raw], rel=1e-9)

        await check()
        changed = {"k3": 0.0, "k5": 40.0, "k7": 0.5}
        await rb.update_priorities("p", changed)
        await rb.delete("p", ["k9", "k11"])
        prios.update(changed)
        del prios["k9"], prios["k11"]
        await sampler.refresh()
        await check()


async def test_uniform_and_ptime_follow_their_distributions(rb: ReplayClient) -> None:
    await rb.create_table("u", sampler={"type": "uniform"})
    keys = [f"u{i}" for i in range(25)]
    await rb.push("u", [{"key": k, "value": 0} for k in keys], wait=True)
    await rb.delete("u", keys[:5])
    async with GpuSampler(rb, "u", seed=4) as sampler:
        await sampler.refresh()
        counts, batch = await draw(sampler, "uniform")
        assert_follows(counts, {k: 1 / 20 for k in keys[5:]})
        assert torch.all(batch.probabilities == 1 / 20) and torch.all(batch.weights == 1)

    half_life = 0.05
    await rb.create_table("r", sampler={"type": "ptime", "half_life_s": half_life})
    for i in range(6):
        await rb.push("r", [{"key": f"r{i}", "value": i}], wait=True)
        await asyncio.sleep(0.02)
    born = {
        it["key"]: it["inserted_at"] for it in await rb.get_many("r", [f"r{i}" for i in range(6)])
    }
    newest = max(born.values())
    mass = {k: 2.0 ** ((t - newest) / half_life) for k, t in born.items()}
    want = {k: m / sum(mass.values()) for k, m in mass.items()}
    async with GpuSampler(rb, "r", seed=5) as sampler:
        assert sampler.selector is not None and sampler.selector.half_life_s == half_life
        counts, batch = await draw(sampler, "ptime")
        assert_follows(counts, want)
        for key, p in zip(batch.keys, batch.probabilities.tolist(), strict=True):
            assert p == pytest.approx(want[key], rel=1e-6)


async def test_deterministic_strategies_and_seeds(rb: ReplayClient) -> None:
    await rb.create_table("d", sampler={"type": "uniform"})
    prios = [3.0, 9.0, 1.0, 7.0, 5.0]
    for i, p in enumerate(prios):  # one push each: a clear insertion order
        await rb.push("d", [{"key": f"d{i}", "value": i, "priority": p}], wait=True)
    await rb.push("d", [{"key": "d1", "value": 1, "priority": 9.0}], wait=True)  # d1 is newest
    async with GpuSampler(rb, "d", seed=1) as sampler:
        top = await sampler.sample(3, strategy="topk")
        assert top.keys == ["d1", "d3", "d4"]
        assert torch.all(top.probabilities == 1) and torch.all(top.weights == 1)
        assert (await sampler.sample(3, strategy="fifo")).keys == ["d0", "d2", "d3"]
        assert (await sampler.sample(2, strategy="lifo")).keys == ["d1", "d4"]
        assert (await sampler.sample(7, strategy="fifo")).keys == [
            "d0",
            "d2",
            "d3",
            "d4",
            "d1",
            "d0",
            "d2",
        ]
        one = await sampler.sample(50, strategy="uniform", seed=11)
        two = await sampler.sample(50, strategy="uniform", seed=11)
        other = await sampler.sample(50, strategy="uniform", seed=12)
        assert one.keys == two.keys != other.keys
        with pytest.raises(ValueError, match="strategy"):
            await sampler.sample(2, strategy="nope")  # type: ignore[arg-type]


def value_of(i: int) -> dict[str, Any]:
    return {
        "obs": np.arange(6, dtype=np.float32).reshape(2, 3) + i,
        "tokens": np.arange(i % 5 + 1, dtype=np.int32) * (i + 1),
        "reward": float(i) / 2,
    }


def assert_columns_match(
    keys: list[str], columns: dict[str, torch.Tensor], pushed: dict[str, Any]
) -> None:
    obs = columns["obs"].cpu().numpy()
    assert obs.shape == (len(keys), 2, 3) and obs.dtype == np.float32
    cu = columns["tokens.cu_seqlens"].cpu().numpy()
    assert cu.dtype == np.int32 and cu.shape == (len(keys) + 1,) and cu[0] == 0
    tokens = columns["tokens"].cpu().numpy()
    assert cu[-1] == len(tokens)
    rewards = columns["reward"].cpu().numpy()
    for row, key in enumerate(keys):
        want = pushed[key]
        np.testing.assert_array_equal(obs[row], want["obs"])
        np.testing.assert_array_equal(tokens[cu[row] : cu[row + 1]], want["tokens"])
        assert rewards[row] == want["reward"]


@pytest.mark.parametrize("batch_size", [7, 300])  # distinct picks, and repeated ones
async def test_collected_columns_equal_the_pushed_values_by_key(
    rb: ReplayClient, batch_size: int
) -> None:
    await rb.create_table("c", sampler={"type": "uniform"})
    pushed = {f"c{i}": value_of(i) for i in range(40)}
    await rb.push("c", [{"key": k, "value": v} for k, v in pushed.items()], wait=True)
    async with GpuSampler(rb, "c", seed=2) as sampler:
        for strategy in ("uniform", "prioritized", "fifo"):
            batch = await sampler.sample(
                batch_size, strategy=strategy, fields=["obs", "tokens", "reward"]
            )
            assert len(batch.keys) == batch_size
            if batch_size > 40 and strategy == "uniform":
                assert len(set(batch.keys)) < batch_size
            assert_columns_match(batch.keys, batch.columns, pushed)
        with pytest.raises(Exception, match="'nope'"):
            await sampler.sample(3, fields=["nope"])


async def test_a_follower_past_the_ring_reloads_and_stays_exact(rb: ReplayClient) -> None:
    await rb.create_table("g", sampler={"type": "prioritized"})
    await rb.push(
        "g", [{"key": f"g{i}", "value": i, "priority": 1.0} for i in range(10)], wait=True
    )
    async with GpuSampler(rb, "g", seed=9, follow=False) as sampler:
        assert sampler.follower.resyncs == 1
        # 200 changes while it does not follow: past the ring of 64
        for start in range(0, 150, 10):
            items = [
                {"key": f"h{i}", "value": i, "priority": 2.0} for i in range(start, start + 10)
            ]
            await rb.push("g", items, wait=True)
        await rb.delete("g", [f"g{i}" for i in range(10)])
        await rb.update_priorities("g", {f"h{i}": 0.0 for i in range(40)})
        await rb.describe_table("g")
        with pytest.raises(Exception, match="no longer kept"):
            await rb.changes("g", sampler.follower.seq)
        await sampler.refresh()
        assert sampler.follower.resyncs == 2
        index = await rb.table_index("g")
        ix = sampler.index
        assert sorted(ix.slot_of) == sorted(index["keys"])
        for key, prio in zip(index["keys"], index["priorities"].tolist(), strict=True):
            assert float(ix.priority[ix.slot_of[key]]) == prio
        counts, _ = await draw(sampler, "prioritized", 40_000)
        assert_follows(counts, {f"h{i}": (0.0 if i < 40 else 1 / 110) for i in range(150)})


def test_device_index_folds_a_batch_and_reuses_slots() -> None:
    ix = DeviceIndex("cpu", capacity=2)
    ix.apply(
        [
            {"op": "put", "key": "a", "priority": 1.0, "inserted_at": 10.0},
            {"op": "put", "key": "b", "priority": 2.0, "inserted_at": 11.0},
            {"op": "priority", "key": "a", "priority": 5.0, "inserted_at": None},
            {"op": "delete", "key": "b", "priority": None, "inserted_at": None},
            {"op": "put", "key": "b", "priority": 3.0, "inserted_at": 12.0},
            {"op": "priority", "key": "zz", "priority": 1.0, "inserted_at": None},
        ]
    )
    assert len(ix) == 2 and ix.used == 3  # b's first slot is free only after the batch
    a, b = ix.slot_of["a"], ix.slot_of["b"]
    assert (float(ix.priority[a]), float(ix.inserted_at[a])) == (5.0, 10.0)
    assert (float(ix.priority[b]), float(ix.inserted_at[b])) == (3.0, 12.0)
    assert int(ix.live.sum()) == 2
    ix.apply(
        [{"op": "put", "key": f"n{i}", "priority": 1.0, "inserted_at": 13.0} for i in range(3000)]
    )
    assert ix.used == 3002 and ix.capacity >= 3002  # the freed slot was reused; doubled
    sel = Selector(ix)
    picks = sel.select(10_000, "uniform", torch.Generator().manual_seed(0))
    assert bool(ix.live[picks.slots].all())
    assert math.isclose(float(picks.probabilities[0]), 1 / 3002)


@cuda
@pytest.mark.cuda
async def test_on_cuda_the_batch_lives_on_the_device(rb: ReplayClient) -> None:
    await rb.create_table("cu", sampler={"type": "prioritized"})
    pushed = {f"c{i}": value_of(i) for i in range(40)}
    await rb.push("cu", [{"key": k, "value": v} for k, v in pushed.items()], wait=True)
    async with GpuSampler(rb, "cu", device="cuda", seed=2) as sampler:
        for _ in range(5):  # the pinned buffers go round their ring
            batch = await sampler.sample(
                300, strategy="prioritized", fields=["obs", "tokens", "reward"]
            )
            assert all(t.device.type == "cuda" for t in batch.columns.values())
            assert batch.weights.device.type == "cuda"
            torch.cuda.synchronize()
            assert_columns_match(batch.keys, batch.columns, pushed)
        counts, _ = await draw(sampler, "prioritized", 100_000)
        assert_follows(counts, {k: 1 / len(pushed) for k in pushed})  # every priority 1
