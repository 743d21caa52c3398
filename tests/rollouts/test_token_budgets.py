"""Token budgets (``max_tokens`` with ``length_field``) and rank-balanced splits
(``world_size``) of claims over HTTP: oldest first, whole groups, at least one group, up
to ``batch_size``; ranks balanced greedy longest first, never splitting a group."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.rollouts.inproc import claim, create, push, serving


def _lengths(got: dict) -> list[int]:
    return [len(it["value"]["tokens"]) for it in got["items"]]


async def test_a_budget_hands_out_oldest_items_within_it(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        sizes = [5, 3, 4, 8, 2, 6]
        await push(
            c, "t", [{"key": f"r{i}", "value": {"tokens": [0] * n}} for i, n in enumerate(sizes)]
        )
        got = await claim(c, "t", task="a", batch_size=64, max_tokens=12, length_field="tokens")
        assert [it["key"] for it in got["items"]] == ["r0", "r1", "r2"]
        assert sum(_lengths(got)) <= 12
        # up to batch_size, even within the budget
        got = await claim(c, "t", task="b", batch_size=2, max_tokens=1000, length_field="tokens")
        assert [it["key"] for it in got["items"]] == ["r0", "r1"]
        # one item alone longer than the budget still goes
        got = await claim(c, "t", task="a", batch_size=64, max_tokens=4, length_field="tokens")
        assert [it["key"] for it in got["items"]] == ["r3"]


async def test_a_budget_keeps_groups_whole(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        sizes = [3, 3, 10, 10, 1, 1]
        await push(
            c,
            "t",
            [
                {"key": f"r{i}", "value": {"tokens": [1] * n}, "group": f"g{i // 2}"}
                for i, n in enumerate(sizes)
            ],
        )
        got = await claim(
            c, "t", task="a", batch_size=6, group_size=2, max_tokens=10, length_field="tokens"
        )
        assert [it["key"] for it in got["items"]] == ["r0", "r1"]
        got = await claim(
            c, "t", task="a", batch_size=6, group_size=2, max_tokens=10, length_field="tokens"
        )
        assert [it["key"] for it in got["items"]] == ["r2", "r3"]  # alone past the budget


async def test_a_budget_waits_until_it_is_filled(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(c, "t", [{"key": "a", "value": {"tokens": [1, 2]}}])
        waiting = asyncio.create_task(
            claim(
                c, "t", task="a", batch_size=10, max_tokens=5, length_field="tokens", wait_ms=30_000
            )
        )
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await push(
            c,
            "t",
            [{"key": "b", "value": {"tokens": [1, 2]}}, {"key": "c", "value": {"tokens": [1, 2]}}],
        )
        got = await asyncio.wait_for(waiting, 20)
        assert [it["key"] for it in got["items"]] == ["a", "b"]
        short = await claim(
            c,
            "t",
            task="b",
            batch_size=10,
            max_tokens=100,
            length_field="tokens",
            wait_ms=50,
            partial=True,
        )
        assert [it["key"] for it in short["items"]] == ["a", "b", "c"]
        r = await c.post(
            "/v1/tables/t/claim",
            json={
                "task": "c",
                "batch_size": 10,
                "max_tokens": 100,
                "length_field": "tokens",
                "wait_ms": 50,
            },
        )
        assert r.status_code == 504, r.text
        r = await c.post(
            "/v1/tables/t/claim", json={"task": "c", "batch_size": 10, "max_tokens": 100}
        )
        assert r.status_code == 422, r.text


async def test_ranks_balance_lengths_and_keep_groups(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        sizes = [9, 1, 4, 4, 7, 2, 3, 3]
        await push(
            c,
            "t",
            [
                {"key": f"r{i}", "value": {"tokens": [1] * n}, "group": f"g{i // 2}"}
                for i, n in enumerate(sizes)
            ],
        )
        got = await claim(
            c, "t", task="a", batch_size=8, group_size=2, length_field="tokens", world_size=2
        )
        ranks = got["ranks"]
        assert sorted(i for rank in ranks for i in rank) == list(range(8))
        groups = [{got["items"][i]["group"] for i in rank} for rank in ranks]
        assert not groups[0] & groups[1]  # no group split
        sums = [sum(sizes[i] for i in rank) for rank in ranks]
        # greedy longest first: groups of 10, 8, 9, 6 -> {10, 6}, {9, 8}
        assert sorted(sums) == [16, 17]
        # without a length field: balanced by count
        await push(c, "t", [{"key": f"s{i}", "value": {"x": i}} for i in range(5)])
        got = await claim(c, "t", task="b", batch_size=13, world_size=3)
        assert sorted(len(rank) for rank in got["ranks"]) == [4, 4, 5]
        # a world larger than the batch: some ranks are empty
        got = await claim(c, "t", task="c", batch_size=2, world_size=4, wait_ms=0, partial=True)
        assert len(got["ranks"]) == 4 and sum(map(len, got["ranks"])) == 2


async def test_budget_and_ranks_with_values_false_over_arrays(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(
            c,
            "t",
            [
                {
                    "key": f"r{i}",
                    "value": {"tokens": list(range(n)), "text": "x" * n},
                    "tags": {"ds": "a"},
                }
                for i, n in enumerate([4, 4, 4, 4])
            ],
        )
        got = await claim(
            c,
            "t",
            task="a",
            batch_size=4,
            max_tokens=8,
            length_field="tokens",
            world_size=2,
            values=False,
            where={"ds": "a"},
        )
        assert [it["lengths"] for it in got["items"]] == [{"tokens": 4, "text": 4}] * 2
        assert got["ranks"] == [[0], [1]]


def test_the_length_of_an_array_field_is_its_first_axis() -> None:
    import numpy as np

    from rlreplay.app.tables.token_budget import field_length
    from rlreplay.wire.codec import packb

    value = packb({"tokens": np.zeros((7, 3), dtype=np.int32), "text": "héllo", "n": 3})
    assert field_length(value, "tokens") == 7
    assert field_length(value, "text") == 5
    assert field_length(value, "n") == 1
    assert field_length(value, "missing") == 0
