"""``sample(where=...)`` on the clients: the async and synchronous clients send the filter,
and the sharded client draws among the matches of every server as one server holding every
item would (probabilities over all the matches), waiting for a match when none exists."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from rlreplay import Client, DeadlineExceeded, ReplayClient, ShardedReplayClient
from tests.live import LiveServer, start_server, stop_server

MEMORY = ("--storage-mode", "memory", "--durability", "none")


def _items(n: int) -> list[dict[str, Any]]:
    return [
        {
            "key": f"k{i}",
            "value": {"x": i},
            "priority": float(1 + i % 5),
            "tags": {"ds": "math" if i % 4 == 0 else "code", "i": i},
        }
        for i in range(n)
    ]


async def test_async_and_sync_clients_send_where(server_url: str, table: str) -> None:
    async with ReplayClient(server_url) as rb:
        await rb.create_table(table, sampler={"type": "uniform"})
        await rb.push(table, _items(20), wait=True)
        picks = await rb.sample(table, 50, where={"ds": "math", "i": {"lt": 9}})
        assert {p["key"] for p in picks} <= {"k0", "k4", "k8"} and len(picks) == 50
        assert all(p["tags"]["ds"] == "math" for p in picks)
        batch = await rb.sample(table, 8, where={"i": {"in": [3]}}, layout="columns")
        assert batch.keys == ["k3"] * 8
        with pytest.raises(DeadlineExceeded):
            await rb.sample(table, 1, where={"ds": "none"}, timeout_ms=50)
    with Client(server_url) as sync:
        picks = sync.sample(table, 10, where={"i": {"gte": 19}})
        assert {p["key"] for p in picks} == {"k19"}
        batch = sync.sample(table, 4, where={"i": 19}, layout="columns")
        assert batch.keys == ["k19"] * 4


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LiveServer]]:
    root = tmp_path_factory.mktemp("where-shards")
    servers: list[LiveServer] = []
    try:
        for i in range(2):
            servers.append(start_server(root / f"s{i}", *MEMORY, "--seed", str(300 + i)))
        yield servers
    finally:
        for server in servers:
            stop_server(server)


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
async def test_sharded_sample_where_is_one_servers_draw(
    two: list[LiveServer], sampler: str
) -> None:
    table = f"w_{sampler}"
    items = _items(60)
    async with ShardedReplayClient([s.url for s in two], seed=7) as rb:
        config = {"type": sampler, **({"exponent": 0.5} if sampler == "prioritized" else {})}
        await rb.create_table(table, sampler=config)
        await rb.push(table, items, wait=True)
        math = [it for it in items if it["tags"]["ds"] == "math"]
        owners = {rb.owner(it["key"]) for it in math}
        assert len(owners) == 2  # the matches live on both servers
        mass = {
            it["key"]: it["priority"] ** 0.5 if sampler == "prioritized" else 1.0 for it in math
        }
        total = sum(mass.values())
        picks = await rb.sample(table, 64, where={"ds": "math"})
        assert len(picks) == 64
        for p in picks:
            assert p["key"] in mass
            assert p["probability"] == pytest.approx(mass[p["key"]] / total, rel=1e-6)
        assert {rb.owner(p["key"]) for p in picks} == owners
        batch = await rb.sample(table, 16, where={"ds": "math"}, layout="columns")
        assert len(batch.keys) == 16 and set(batch.keys) <= set(mass)
        assert batch.probabilities is not None
        for key, prob in zip(batch.keys, batch.probabilities.tolist(), strict=True):
            assert prob == pytest.approx(mass[key] / total, rel=1e-6)
        # no match anywhere: it waits, and a push on either server wakes it
        waiting = asyncio.create_task(rb.sample(table, 2, where={"ds": "late"}, timeout_ms=30_000))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await rb.push(table, [{"key": "late", "value": 1, "tags": {"ds": "late"}}])
        picks = await asyncio.wait_for(waiting, 20)
        assert [p["key"] for p in picks] == ["late", "late"]
        with pytest.raises(DeadlineExceeded):
            await rb.sample(table, 1, where={"ds": "never"}, timeout_ms=100)


async def test_push_columns_with_tags_and_a_reservation_on_every_client(
    two: list[LiveServer], server_url: str
) -> None:
    import numpy as np

    from rlreplay import Client

    keys = [f"{{g{i // 2}}}/{i}" for i in range(8)]
    meta: dict[str, Any] = {
        "tags": [{"ds": "math" if i % 2 else "code"} for i in range(8)],
        "groups": [f"g{i // 2}" for i in range(8)],
        "versions": [1] * 8,
    }
    columns = {"tokens": np.arange(16, dtype=np.int32).reshape(8, 2)}
    async with ShardedReplayClient([s.url for s in two]) as rb:
        await rb.create_table("cols", sampler={"type": "fifo"}, admission={"max_ahead": 100})
        got = await rb.reserve("cols", 8, version=1)
        n = await rb.push_columns("cols", keys, columns, wait=True, reservation=got.id, **meta)
        # each server granted 4 slots and fills them with the items it holds
        held = [sum(rb.owner(k) == s.url for k in keys) for s in two]
        unfilled = sum(max(0, 4 - h) for h in held)
        assert n == 8 and (await rb.tasks("cols"))["reserved"] == unfilled
        lease = await rb.claim(
            "cols", task="t", batch_size=8, where={"ds": "math"}, partial=True, wait_ms=0
        )
        assert sorted(lease.keys) == sorted(keys[1::2])
        assert all(it["version"] == 1 and it["tags"] == {"ds": "math"} for it in lease.items)
    with Client(server_url) as sync:
        sync.create_table("cols_sync", sampler={"type": "fifo"})
        got = sync.reserve("cols_sync", 2, version=0)
        assert (
            sync.push_columns(
                "cols_sync",
                ["a", "b"],
                {"x": np.zeros((2, 3))},
                wait=True,
                tags=[{"k": 1}, None],
                reservation=got.id,
            )
            == 2
        )
        assert sync.tasks("cols_sync")["reserved"] == 0
        assert sync.get("cols_sync", "a")["tags"] == {"k": 1}
