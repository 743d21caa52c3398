"""Token budgets and ranks of sharded claims: ``max_tokens`` holds for the merged batch
(not per server), and ``ranks`` split the merged items, groups whole, over two real
servers on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlreplay import DeadlineExceeded, ShardedReplayClient
from tests.live import LiveServer, start_servers, stop_server

MEMORY = ("--storage-mode", "memory", "--durability", "none")


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LiveServer]]:
    root = tmp_path_factory.mktemp("budget-shards")
    servers = start_servers([(root / f"s{i}", (*MEMORY, "--seed", str(400 + i))) for i in range(2)])
    try:
        yield servers
    finally:
        for server in servers:
            stop_server(server)


def _groups(n: int, sizes: list[int]) -> list[dict[str, object]]:
    return [
        {
            "key": f"{{g{g}}}/{i}",
            "value": {"prompt": f"p{g}", "tokens": [1] * sizes[g % len(sizes)]},
            "group": f"g{g}",
        }
        for g in range(n)
        for i in range(2)
    ]


async def test_a_sharded_budget_holds_for_the_merged_batch(two: list[LiveServer]) -> None:
    async with ShardedReplayClient([s.url for s in two], seed=3) as rb:
        await rb.create_table("b", sampler={"type": "fifo"})
        await rb.push("b", _groups(8, [3]), wait=True)
        assert len({rb.owner(f"{{g{g}}}/0") for g in range(8)}) == 2
        lease = await rb.claim(
            "b",
            task="a",
            batch_size=16,
            group_size=2,
            max_tokens=20,
            length_field="tokens",
            world_size=2,
            select=["prompt"],
        )
        # groups of 6 tokens: three fit in 20 (over both servers), not four
        assert len(lease.items) == 6
        assert all(set(it["value"]) == {"prompt"} for it in lease.items)  # tokens taken out
        assert lease.ranks is not None and len(lease.ranks) == 2
        assert sorted(i for rank in lease.ranks for i in rank) == list(range(6))
        for rank in lease.ranks:
            assert len({lease.items[i]["group"] for i in rank}) <= 2
            groups = [lease.items[i]["group"] for i in rank]
            assert all(groups.count(g) == 2 for g in groups)  # never split
        assert sorted(len(rank) for rank in lease.ranks) == [2, 4]
        await lease.ack()
        # at least one group, even if alone past the budget
        lease = await rb.claim(
            "b", task="a", batch_size=16, group_size=2, max_tokens=1, length_field="tokens"
        )
        assert len(lease.items) == 2 and lease.ranks is None
        await lease.ack()
        # values: false measures without values; what is left fits
        lease = await rb.claim(
            "b",
            task="a",
            batch_size=16,
            max_tokens=100,
            length_field="tokens",
            values=False,
            partial=True,
            wait_ms=0,
        )
        assert len(lease.items) == 8
        assert all(it["lengths"] == {"prompt": 2, "tokens": 3} for it in lease.items)
        await lease.ack()
        # a budget that cannot be filled: 504 without partial, nothing kept leased
        with pytest.raises(DeadlineExceeded):
            await rb.claim(
                "b", task="a", batch_size=2, max_tokens=10, length_field="tokens", wait_ms=100
            )
        got = await rb.claim(
            "b",
            task="c",
            batch_size=64,
            max_tokens=1000,
            length_field="tokens",
            partial=True,
            wait_ms=0,
        )
        assert len(got.items) == 16
        assert sum(len(it["value"]["tokens"]) for it in got.items) == 48
