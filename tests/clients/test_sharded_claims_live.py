"""Sharded claims over three real servers on 127.0.0.1: a claim that waits longer than its
leases last never returns a lease that has expired, so no item is held by two callers at
once; a claim whose answer would pass a server's ``--max-response-mb`` is refused and
leaves nothing leased on any server."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rlreplay import ShardedReplayClient, ValidationFailed
from tests.live import LiveServer, start_servers, stop_server

MEMORY = ("--storage-mode", "memory", "--durability", "none", "--max-response-mb", "1")
ITEMS = 60
CALLERS = 6


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LiveServer]]:
    root = tmp_path_factory.mktemp("claim-shards")
    servers = start_servers([(root / f"s{i}", (*MEMORY, "--seed", str(300 + i))) for i in range(3)])
    try:
        yield servers
    finally:
        for server in servers:
            stop_server(server)


def client(servers: list[LiveServer]) -> ShardedReplayClient:
    return ShardedReplayClient([s.url for s in servers], backoff_s=0.01)


async def test_claims_waiting_past_their_leases_never_return_an_expired_lease(
    shards: list[LiveServer],
) -> None:
    async with client(shards) as rb:
        await rb.create_table("lapse", sampler={"type": "fifo"})
        items = [{"key": f"k{i}", "value": {"prompt": i}} for i in range(ITEMS)]
        assert await rb.push("lapse", items, wait=True) == ITEMS
        # six callers want 120 items of 60: they wait 3 s, while each lease lasts 1 s
        got: list[tuple[float, Any]] = []

        async def caller() -> None:
            for _ in range(2):
                lease = await rb.claim(
                    "lapse", task="t", batch_size=20, lease_s=1.0, wait_ms=3000, partial=True
                )
                got.append((time.time(), lease))

        await asyncio.gather(*(caller() for _ in range(CALLERS)))
    held = [(at, lease) for at, lease in got if lease.items]
    assert held, "no claim handed anything out"
    for at, lease in held:
        assert lease.expires_at > at, (lease.expires_at - at, lease.parts)
        for _, part in lease.parts:
            assert part.expires_at > at
    # an item is never held by two callers at once: the leases holding it do not overlap
    spans: dict[str, list[tuple[float, float]]] = {}
    for at, lease in held:
        for key in lease.keys:
            spans.setdefault(key, []).append((at, lease.expires_at))
    for key, times in spans.items():
        times.sort()
        for (_, end), (start, _) in itertools.pairwise(times):
            assert start >= end, (key, times)


@pytest.mark.parametrize("group_size", [None, 4])
async def test_a_sharded_claim_past_a_servers_cap_leaves_nothing_leased(
    shards: list[LiveServer], group_size: int | None
) -> None:
    table = f"cap{group_size or 0}"
    async with client(shards) as rb:
        await rb.create_table(table, sampler={"type": "fifo"})
        # 48 items of 64 KiB on each server's tag: 3 MiB on one server, past its 1 MiB
        items = [
            {"key": f"{{g}}/{i:02d}", "value": {"big": bytes(64 * 1024)}, "group": f"g{i // 4}"}
            for i in range(48)
        ]
        assert await rb.push(table, items, wait=True) == 48
        with pytest.raises(ValidationFailed, match="max-response-mb"):
            await rb.claim(table, task="t", batch_size=48, group_size=group_size, wait_ms=0)
        tasks = (await rb.tasks(table))["tasks"]
        assert tasks["t"]["leased"] == 0
        lease = await rb.claim(table, task="t", batch_size=8, group_size=group_size, wait_ms=0)
        assert sorted(lease.keys) == [f"{{g}}/{i:02d}" for i in range(8)]
