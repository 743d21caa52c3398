"""Rollout tables spread over three real servers on 127.0.0.1 through ``ShardedReplayClient``.

Keys sharing a hash tag (``{group}/i``) land on one server, so claims of whole groups work
across shards; every task gets every ready item exactly once over the servers, releases
hand items back, acknowledgements stick, concurrent claims and ``consume`` hand each item
out once, and a claim that cannot be filled leaves nothing leased. A server that cannot be
reached is named, or skipped with ``allow_partial``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from rlreplay import (
    DeadlineExceeded,
    ReplayClient,
    ShardedReplayClient,
    Unavailable,
    ValidationFailed,
)
from rlreplay.clients.sharded_rollouts import ShardedLease
from tests.live import LiveServer, free_port, start_servers, stop_server

MEMORY = ("--storage-mode", "memory", "--durability", "none")
TRAINER, CRITIC = "trainer", "critic"
GROUPS, GROUP_SIZE = 12, 8


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LiveServer]]:
    root = tmp_path_factory.mktemp("rollout-shards")
    servers = start_servers([(root / f"s{i}", (*MEMORY, "--seed", str(200 + i))) for i in range(3)])
    try:
        yield servers
    finally:
        for server in servers:
            stop_server(server)


def client(servers: list[LiveServer], **options: Any) -> ShardedReplayClient:
    return ShardedReplayClient([s.url for s in servers], backoff_s=0.01, **options)


def grouped(groups: int = GROUPS) -> list[dict[str, Any]]:
    return [
        {"key": f"{{g{g}}}/{i}", "value": {"prompt": g * 100 + i}, "group": f"g{g}"}
        for g in range(groups)
        for i in range(GROUP_SIZE)
    ]


async def fresh(rb: ShardedReplayClient, table: str, items: list[dict[str, Any]]) -> None:
    await rb.create_table(table, sampler={"type": "fifo"})
    assert await rb.push(table, items, wait=True) == len(items)


async def drain(
    rb: ShardedReplayClient, table: str, task: str, batch_size: int, **claim: Any
) -> list[ShardedLease]:
    """Claims (acknowledged) until one hands out nothing; bounded in count."""
    leases = []
    for _ in range(200):
        lease = await rb.claim(
            table, task=task, batch_size=batch_size, wait_ms=0, partial=True, **claim
        )
        if not lease.items:
            return leases
        assert len(lease) <= batch_size
        await lease.ack()
        leases.append(lease)
    raise AssertionError("the table never ran dry")


async def test_groups_keyed_by_hash_tag_land_whole_on_one_server(
    shards: list[LiveServer],
) -> None:
    items = grouped()
    async with client(shards) as rb:
        await fresh(rb, "tagged", items)
    where: dict[str, set[str]] = {}
    for server in shards:
        async with ReplayClient(server.url) as one:
            got = await one.get_many("tagged", [it["key"] for it in items])
        for item, found in zip(items, got, strict=True):
            if found is not None:
                where.setdefault(item["group"], set()).add(server.url)
                assert found["group"] == item["group"]
    assert len(where) == GROUPS
    assert all(len(servers) == 1 for servers in where.values())  # whole on one server
    assert len(set().union(*where.values())) > 1  # and the groups spread


async def test_claims_hand_out_every_ready_group_once_with_only_the_fields_asked(
    shards: list[LiveServer],
) -> None:
    items = grouped()
    ready = [f"g{g}" for g in range(GROUPS) if g % 4 != 3]  # 9 of the 12 groups get a reward
    async with client(shards) as rb:
        await fresh(rb, "grpo", items)
        patched = await rb.patch(
            "grpo",
            {it["key"]: {"reward": 1.0} for it in items if it["group"] in ready}
            | {"{nope}/0": {"reward": 0.0}},
            wait=True,
        )
        assert patched == {"committed": len(ready) * GROUP_SIZE, "missing": 1}
        leases = await drain(rb, "grpo", TRAINER, 2 * GROUP_SIZE, fields=["reward"], group_size=8)
        handed = [it for lease in leases for it in lease.items]
        assert Counter(it["key"] for it in handed) == Counter(
            it["key"] for it in items if it["group"] in ready
        )  # every ready item, exactly once
        for lease in leases:
            assert set(Counter(it["group"] for it in lease.items).values()) == {GROUP_SIZE}
            assert all(set(it["value"]) == {"reward"} for it in lease.items)
        tasks = await rb.tasks("grpo")
        assert tasks["tasks"][TRAINER]["acked"] == len(ready) * GROUP_SIZE
        assert tasks["tasks"][TRAINER]["leased"] == 0
        assert await rb.set_version("grpo", 3) == {"version": 3, "dropped_stale": 0}
        assert (await rb.tasks("grpo"))["version"] == 3
        with pytest.raises(ValidationFailed, match="multiple of group_size"):
            await rb.claim("grpo", task=TRAINER, batch_size=12, group_size=8)


async def test_two_tasks_each_consume_everything_once(shards: list[LiveServer]) -> None:
    items = [{"key": f"k{i}", "value": {"x": i}} for i in range(60)]
    async with client(shards) as rb:
        await fresh(rb, "two_tasks", items)
        trainer, critic = await asyncio.gather(
            drain(rb, "two_tasks", TRAINER, 7), drain(rb, "two_tasks", CRITIC, 11)
        )
        for leases in (trainer, critic):
            assert sorted(k for lease in leases for k in lease.keys) == sorted(
                it["key"] for it in items
            )
        counts = (await rb.tasks("two_tasks"))["tasks"]
        assert counts[TRAINER]["acked"] == counts[CRITIC]["acked"] == 60


async def test_concurrent_claims_of_one_task_hand_out_each_group_once(
    shards: list[LiveServer],
) -> None:
    """Two claims of one task in flight at a time, across the servers, leases far longer
    than the test: none expires, so each item is handed out once."""
    items = grouped()
    async with client(shards) as rb:
        await fresh(rb, "concurrent", items)
        seen: list[str] = []

        async def consumer() -> None:
            for _ in range(100):  # bounded: the table runs dry first
                if len(seen) >= len(items):
                    return
                try:
                    lease = await rb.claim(
                        "concurrent", task=TRAINER, batch_size=2 * GROUP_SIZE,
                        group_size=GROUP_SIZE, lease_s=600, wait_ms=200,
                    )  # fmt: skip
                except DeadlineExceeded:  # the other claim holds part of what is left
                    continue
                seen.extend(lease.keys)
                assert await lease.ack() == len(lease)

        await asyncio.gather(consumer(), consumer())
        assert Counter(seen) == Counter(it["key"] for it in items)  # each once
        counts = (await rb.tasks("concurrent"))["tasks"][TRAINER]
        assert counts == {"ready": 0, "leased": 0, "acked": len(items), "expired": 0}


async def test_consume_across_shards_hands_out_whole_groups_once(
    shards: list[LiveServer],
) -> None:
    """Two claims in flight compete for the last groups; the one answered first comes
    first, so the loop never waits for items the other holds."""
    items = grouped()
    async with client(shards) as rb:
        await fresh(rb, "consumed", items)
        seen: list[str] = []
        batches = rb.consume(
            "consumed", task=TRAINER, batch_size=2 * GROUP_SIZE, group_size=GROUP_SIZE,
            prefetch=2, lease_s=600, wait_ms=200,
        )  # fmt: skip
        async with asyncio.timeout(60):
            async for lease in batches:  # bounded: breaks once every item came
                assert len(lease) == 2 * GROUP_SIZE
                assert set(Counter(it["group"] for it in lease.items).values()) == {GROUP_SIZE}
                seen += lease.keys
                if len(seen) >= len(items):
                    break
            await batches.aclose()
        assert Counter(seen) == Counter(it["key"] for it in items)  # each once
        counts = (await rb.tasks("consumed"))["tasks"][TRAINER]
        # every lease but the one in hand when the loop ended was acknowledged; that one was
        # released, and a prefetched claim a server answered as the loop closed may hold
        # its items until its lease expires
        assert counts["acked"] == len(items) - 2 * GROUP_SIZE and counts["expired"] == 0
        assert counts["ready"] + counts["leased"] == 2 * GROUP_SIZE


async def test_release_hands_items_back_and_ack_sticks(shards: list[LiveServer]) -> None:
    items = [{"key": f"k{i}", "value": {"x": i}} for i in range(30)]
    async with client(shards) as rb:
        await fresh(rb, "leases", items)
        lease = await rb.claim("leases", task=TRAINER, batch_size=10, wait_ms=2000)
        assert len(lease) == 10 and lease.id and lease.expires_at > 0
        assert await lease.release(lease.keys[:4]) == 4
        assert await lease.release() == 10  # as one server: those released before included
        with pytest.raises(RuntimeError):
            async with await rb.claim("leases", task=TRAINER, batch_size=30) as whole:
                assert len(whole) == 30  # the released ten among them
                raise RuntimeError("the task failed")
        async with await rb.claim("leases", task=TRAINER, batch_size=12) as acked:
            assert len(acked) == 12
        # a fresh client's partial claim no longer sees the acknowledged items
    async with client(shards) as again:
        rest = await again.claim("leases", task=TRAINER, batch_size=30, wait_ms=0, partial=True)
        assert sorted(rest.keys) == sorted(set(it["key"] for it in items) - set(acked.keys))
        await rest.release()


async def test_a_claim_that_cannot_be_filled_leaves_nothing_leased(
    shards: list[LiveServer],
) -> None:
    items = [{"key": f"k{i}", "value": {"x": i}} for i in range(5)]
    async with client(shards) as rb:
        await fresh(rb, "short", items)
        with pytest.raises(DeadlineExceeded):
            await rb.claim("short", task=TRAINER, batch_size=8, wait_ms=300)
        assert (await rb.tasks("short"))["tasks"].get(TRAINER, {}).get("leased", 0) == 0
        lease = await rb.claim("short", task=TRAINER, batch_size=5, wait_ms=2000)
        assert sorted(lease.keys) == sorted(it["key"] for it in items)


async def test_a_claim_waits_for_items_pushed_later(shards: list[LiveServer]) -> None:
    items = [{"key": f"late{i}", "value": {"x": i}} for i in range(9)]
    async with client(shards) as rb:
        await fresh(rb, "late", items[:4])

        async def push_later() -> None:
            await asyncio.sleep(0.2)
            await rb.push("late", items[4:], wait=True)

        lease, _ = await asyncio.gather(
            rb.claim("late", task=TRAINER, batch_size=9, wait_ms=30_000), push_later()
        )
        assert sorted(lease.keys) == sorted(it["key"] for it in items)
        await lease.ack()


async def test_a_server_down_is_named_unless_allow_partial(shards: list[LiveServer]) -> None:
    items = [{"key": f"k{i}", "value": {"x": i}} for i in range(20)]
    async with client(shards) as rb:
        await fresh(rb, "down", items)
    dead = f"http://127.0.0.1:{free_port()}"
    urls = [s.url for s in shards] + [dead]
    async with ShardedReplayClient(urls, retries=0) as strict:
        with pytest.raises(Unavailable, match=dead):
            await strict.claim("down", task=TRAINER, batch_size=20, wait_ms=0, partial=True)
    async with ShardedReplayClient(urls, retries=0, allow_partial=True) as lenient:
        lease = await lenient.claim("down", task=TRAINER, batch_size=20, wait_ms=2000)
        assert sorted(lease.keys) == sorted(it["key"] for it in items)
        assert await lease.ack() == 20


async def test_a_batch_on_one_server_fills_without_waiting(shards: list[LiveServer]) -> None:
    """Each server is first asked for its share only; what one server holds beyond it is
    still claimed at once, without ``partial`` and without waiting."""
    items = [{"key": f"{{one}}/{i}", "value": {"x": i}} for i in range(24)]
    async with client(shards) as rb:
        await fresh(rb, "uneven", items)
        assert len({rb.owner(it["key"]) for it in items}) == 1
        lease = await rb.claim("uneven", task=TRAINER, batch_size=24, wait_ms=0)
        assert sorted(lease.keys) == sorted(it["key"] for it in items)
        assert len(lease.parts) == 2  # the share, then the rest, from the one server
        assert await lease.ack() == 24
