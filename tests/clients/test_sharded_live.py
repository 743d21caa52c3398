"""A table spread over three real servers on 127.0.0.1 through ``ShardedReplayClient``.

Keys live on one server each (checked on each server directly), reads come back in the
order asked, and sampling across the shards passes the same chi-square bar as one server
(p-value under 1e-4 fails), with every pick's probability and weight those one server
holding every item would report. A shard killed with SIGKILL fails the calls that need it
with ``Unavailable`` naming it, and once restarted it still holds every write it answered.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlreplay import ReplayClient, ShardedReplayClient, Unavailable
from tests.live import LiveServer, start_server, start_servers, stop_server
from tests.selection.test_http_selection import assert_follows

MEMORY = ("--storage-mode", "memory", "--durability", "none")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LiveServer]]:
    root = tmp_path_factory.mktemp("shards")
    servers = start_servers([(root / f"s{i}", (*MEMORY, "--seed", str(100 + i))) for i in range(3)])
    try:
        yield servers
    finally:
        for server in servers:
            stop_server(server)


def urls(servers: list[LiveServer]) -> list[str]:
    return [s.url for s in servers]


async def on_each(servers: list[LiveServer], table: str, keys: list[str]) -> list[set[str]]:
    """The keys each server holds, asked of each server directly."""
    held = []
    for server in servers:
        async with ReplayClient(server.url) as one:
            got = await one.get_many(table, keys)
        held.append({k for k, item in zip(keys, got, strict=True) if item is not None})
    return held


async def test_keys_land_on_one_server_each_and_stay(shards: list[LiveServer]) -> None:
    keys = [f"place/{i}" for i in range(300)]
    async with ShardedReplayClient(urls(shards)) as rb:
        await rb.create_table("place", sampler={"type": "uniform"})
        items = [{"key": k, "value": i} for i, k in enumerate(keys)]
        assert await rb.push("place", items, wait=True) == 300
        owners = {k: rb.owner(k) for k in keys}
        info = await rb.describe_table("place")
    held = await on_each(shards, "place", keys)
    assert sum(len(h) for h in held) == 300
    for server, keys_there in zip(shards, held, strict=True):
        assert keys_there == {k for k in keys if owners[k] == server.url}
        assert 50 < len(keys_there) < 150  # spread, not all on one
    assert info["stats"]["size"] == 300
    assert sorted(info["shards"]) == sorted(urls(shards))
    # replacing, from a client that lists the servers in another order, keeps each key put
    async with ShardedReplayClient(urls(shards)[::-1]) as again:
        assert all(again.owner(k) == owners[k] for k in keys)
        await again.push("place", [{"key": k, "value": -1} for k in keys[:90]], wait=True)
        assert await again.update_priorities("place", {keys[0]: 3.0, "nope": 1.0}) == {
            "updated": 1,
            "missing": 1,
        }
        assert await again.delete("place", keys[200:]) == 100
    after = await on_each(shards, "place", keys)
    for before, now in zip(held, after, strict=True):
        assert now == before - set(keys[200:])


async def test_batch_get_across_shards_in_the_order_asked(shards: list[LiveServer]) -> None:
    async with ShardedReplayClient(urls(shards)) as rb:
        await rb.create_table("order", sampler={"type": "uniform"})
        keys = [f"o{i}" for i in range(60)]
        await rb.push_columns(
            "order",
            keys,
            {"x": np.arange(60, dtype=np.float32)[:, None] * np.ones((60, 3), np.float32)},
            priorities=np.arange(60, dtype=np.float64) + 1,
            wait=True,
        )
        asked = ["o59", "zz", "o3", "o31", "o0", "gone", "o17", "o3"]
        got = await rb.get_many("order", asked)
        assert [None if g is None else g["key"] for g in got] == [
            None if k in {"zz", "gone"} else k for k in asked
        ]
        assert [g["value"]["x"][0] for g in got if g is not None] == [59, 3, 31, 0, 17, 3]
        assert [g["priority"] for g in got if g is not None] == [60, 4, 32, 1, 18, 4]
        cols = await rb.get_many("order", asked, layout="columns")
        assert cols.keys == ["o59", "o3", "o31", "o0", "o17", "o3"]
        assert cols.missing == ["zz", "gone"]
        assert cols["x"][:, 0].tolist() == [59, 3, 31, 0, 17, 3]
        assert cols.priorities.tolist() == [60, 4, 32, 1, 18, 4]
        assert await rb.get("order", "o42") is not None
        assert await rb.get("order", "zz") is None


async def draw(rb: ShardedReplayClient, table: str, total: int) -> list[dict[str, Any]]:
    picks: list[dict[str, Any]] = []
    while len(picks) < total:
        picks += await rb.sample(table, 2000, include_values=False)
    return picks


async def test_uniform_sampling_across_shards_is_one_servers(shards: list[LiveServer]) -> None:
    async with ShardedReplayClient(urls(shards), seed=5) as rb:
        await rb.create_table("uni", sampler={"type": "uniform"})
        keys = [f"u{i}" for i in range(25)]
        await rb.push("uni", [{"key": k, "value": 0} for k in keys], wait=True)
        await rb.delete("uni", keys[:5])
        picks = await draw(rb, "uni", 40_000)
    assert_follows(picks, {k: 1 / 20 for k in keys[5:]})
    assert all(p["probability"] == pytest.approx(1 / 20, rel=1e-12) for p in picks)
    assert all(p["weight"] == 1.0 for p in picks)


async def test_prioritized_sampling_across_shards_is_one_servers(
    shards: list[LiveServer],
) -> None:
    alpha, beta = 0.6, 0.4
    prios = {f"p{i}": float(i) for i in range(15)}  # p0 has priority 0: never drawn

    def expected() -> dict[str, float]:
        mass = {k: v**alpha if v > 0 else 0.0 for k, v in prios.items()}
        total = sum(mass.values())
        return {k: m / total for k, m in mass.items()}

    def check_batch(keys: list[str], probs: list[float], weights: list[float]) -> None:
        want = expected()
        assert probs == pytest.approx([want[k] for k in keys], rel=1e-9)
        n = len(prios)  # one server's formula: (N P)^-beta over the batch's largest
        raw = [(n * want[k]) ** -beta for k in keys]
        assert weights == pytest.approx([w / max(raw) for w in raw], rel=1e-9)

    async with ShardedReplayClient(urls(shards), seed=6) as rb:
        config = {"type": "prioritized", "exponent": alpha, "is_exponent": beta}
        await rb.create_table("prio", sampler=config)
        items = [{"key": k, "value": {"i": int(k[1:])}, "priority": p} for k, p in prios.items()]
        await rb.push("prio", items, wait=True)
        for step in range(2):
            picks = await draw(rb, "prio", 60_000)
            assert_follows(picks, expected())
            for start in range(0, 6000, 2000):
                batch = picks[start : start + 2000]
                keys = [p["key"] for p in batch]
                check_batch(keys, [p["probability"] for p in batch], [p["weight"] for p in batch])
            cols = await rb.sample("prio", 64, layout="columns")
            assert cols.probabilities is not None and cols.weights is not None
            check_batch(cols.keys, cols.probabilities.tolist(), cols.weights.tolist())
            assert [f"p{i}" for i in cols["i"].tolist()] == cols.keys  # values with their keys
            if step == 0:  # then after priority updates (one to 0, one way up) and deletes
                changed = {"p3": 0.0, "p5": 40.0, "p7": 0.5}
                await rb.update_priorities("prio", changed)
                prios.update(changed)
                await rb.delete("prio", ["p9", "p11"])
                del prios["p9"], prios["p11"]


async def test_all_zero_priorities_fall_back_to_uniform_across_shards(
    shards: list[LiveServer],
) -> None:
    async with ShardedReplayClient(urls(shards), seed=7) as rb:
        await rb.create_table("zero", sampler={"type": "prioritized", "exponent": 1.0})
        keys = [f"z{i}" for i in range(12)]
        await rb.push("zero", [{"key": k, "value": 0, "priority": 0.0} for k in keys], wait=True)
        picks = await draw(rb, "zero", 24_000)
    assert_follows(picks, {k: 1 / 12 for k in keys})
    assert all(p["probability"] == pytest.approx(1 / 12, rel=1e-12) for p in picks)


async def test_stream_over_shards(shards: list[LiveServer]) -> None:
    async with ShardedReplayClient(urls(shards), seed=8) as rb:
        await rb.create_table("flow", sampler={"type": "uniform"})
        keys = [f"f{i}" for i in range(30)]
        await rb.push("flow", [{"key": k, "value": {"i": i}} for i, k in enumerate(keys)])
        seen = 0
        async with aclosing(rb.stream("flow", batch_size=32, prefetch=3)) as batches:
            async for batch in batches:
                assert len(batch) == 32
                assert all(p["probability"] == pytest.approx(1 / 30) for p in batch)
                assert all(p["value"]["i"] == int(p["key"][1:]) for p in batch)
                seen += 1
                if seen == 5:
                    break
        # every batch was drawn on the servers (the stream closed with samples in flight)
        assert (await rb.describe_table("flow"))["stats"]["samples"] >= 5 * 32


def kill(server: LiveServer) -> None:
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(10)


async def test_killed_shard_is_named_and_keeps_what_it_answered(tmp_path: Path) -> None:
    servers = start_servers([(tmp_path / f"d{i}", ("--seed", str(i))) for i in range(3)])
    try:
        answered: list[str] = []
        async with ShardedReplayClient(urls(servers), retries=1, backoff_s=0.05) as rb:
            await rb.create_table("dur", sampler={"type": "uniform"})
            victim = servers[1]
            enough = asyncio.Event()  # the pusher is well under way

            async def pusher() -> None:
                for i in range(100_000):  # bounded; ends at the first Unavailable
                    batch = [f"dur{i}.{j}" for j in range(8)]
                    try:
                        await rb.push("dur", [{"key": k, "value": i} for k in batch])
                    except Unavailable:
                        return
                    answered.extend(batch)  # wait=False: answered once in the log
                    if len(answered) >= 400:
                        enough.set()
                raise AssertionError("the pusher never saw the shard go")

            task = asyncio.create_task(pusher())
            await asyncio.wait_for(enough.wait(), 60)
            kill(victim)
            await asyncio.wait_for(task, 60)
            lost_key = next(f"x{i}" for i in range(1000) if rb.owner(f"x{i}") == victim.url)
            with pytest.raises(Unavailable, match=victim.url):
                await rb.push("dur", [{"key": lost_key, "value": 0}])
            with pytest.raises(Unavailable, match=victim.url):
                await rb.get("dur", lost_key)
            with pytest.raises(Unavailable, match=victim.url):
                await rb.sample("dur", 8)
            # explicitly, the other shards still sample: only their items come back
            picks = await rb.sample("dur", 200, allow_partial=True, include_values=False)
            assert len(picks) == 200
            assert all(rb.owner(p["key"]) != victim.url for p in picks)
            survivors = 0
            for server in (servers[0], servers[2]):
                async with ReplayClient(server.url) as one:
                    survivors += (await one.describe_table("dur"))["stats"]["size"]
            assert all(p["probability"] == pytest.approx(1 / survivors) for p in picks)

            port = int(victim.url.rsplit(":", 1)[1])
            servers[1] = start_server(
                tmp_path / "d1", "--seed", "1", data_dir=victim.data_dir, port=port
            )
            got = await rb.get_many("dur", answered)
            assert [k for k, item in zip(answered, got, strict=True) if item is None] == []
            assert (await rb.describe_table("dur"))["stats"]["size"] >= len(answered)
    finally:
        for server in servers:
            stop_server(server)
