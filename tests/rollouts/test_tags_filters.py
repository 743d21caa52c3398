"""Tags on push and patch, and ``where`` filters on claim and sample, over HTTP (the
contract's "Rollout tables at scale"): answered from the tag index, combined with groups,
``min_version``, ``select`` and ``values: false``, and kept across a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.rollouts.inproc import claim, create, push, serving


def _items(n: int) -> list[dict[str, Any]]:
    return [
        {
            "key": f"r{i}",
            "value": {"prompt": "p" * (i + 1), "tokens": list(range(i + 1))},
            "group": f"g{i // 2}",
            "version": i % 4,
            "tags": {"ds": "math" if (i // 2) % 2 == 0 else "code", "level": i, "hard": i >= 8},
        }
        for i in range(n)
    ]


async def test_tags_come_back_on_get_sample_and_claim(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(c, "t", _items(4))
        item = (await c.get("/v1/tables/t/items/r1")).json()
        assert item["tags"] == {"ds": "math", "level": 1, "hard": False}
        batch = (await c.post("/v1/tables/t/items:batchGet", json={"keys": ["r2"]})).json()
        assert batch["items"][0]["tags"]["ds"] == "code"
        picks = (await c.post("/v1/tables/t/sample", json={"batch_size": 2})).json()["items"]
        assert all("tags" in p for p in picks)
        got = await claim(c, "t", task="a", batch_size=4)
        assert [it["tags"]["level"] for it in got["items"]] == [0, 1, 2, 3]


async def test_where_equality_in_and_ranges_must_all_hold(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(c, "t", _items(12))

        tasks = iter(range(100))

        async def keys(**where: Any) -> list[str]:
            got = await claim(
                c,
                "t",
                task=f"task{next(tasks)}",
                batch_size=12,
                where=where,
                wait_ms=0,
                partial=True,
            )
            return [it["key"] for it in got["items"]]

        assert await keys(ds="code") == ["r2", "r3", "r6", "r7", "r10", "r11"]
        assert await keys(level={"in": [3, 5, 100]}) == ["r3", "r5"]
        assert await keys(level={"gte": 4, "lt": 7}) == ["r4", "r5", "r6"]
        assert await keys(level={"gt": 4, "lte": 7}, ds="math") == ["r5"]
        assert await keys(hard=True, ds={"in": ["math"]}) == ["r8", "r9"]
        assert await keys(hard=1) == []  # a bool is not a number
        assert await keys(nothing="x") == []


async def test_where_with_groups_and_min_version(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(c, "t", _items(12))
        got = await claim(
            c, "t", task="a", batch_size=4, group_size=2, where={"ds": "math"}, min_version=0
        )
        assert [it["key"] for it in got["items"]] == ["r0", "r1", "r4", "r5"]
        # min_version drops r0 and r4 (versions 0): their groups are not whole any more
        got = await claim(
            c,
            "t",
            task="b",
            batch_size=2,
            group_size=2,
            where={"ds": "math"},
            min_version=1,
            wait_ms=0,
            partial=True,
        )
        assert got["items"] == []
        got = await claim(
            c,
            "t",
            task="c",
            batch_size=4,
            where={"ds": "math"},
            min_version=1,
            wait_ms=0,
            partial=True,
        )
        assert [it["key"] for it in got["items"]] == ["r1", "r5", "r9"]


async def test_a_claim_with_where_waits_without_polling_for_a_match(tmp_path: Path) -> None:
    import asyncio

    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(c, "t", [{"key": "a", "value": {"x": 1}, "tags": {"ds": "code"}}])
        waiting = asyncio.create_task(
            claim(c, "t", task="a", batch_size=1, where={"ds": "math"}, wait_ms=30_000)
        )
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await push(c, "t", [{"key": "b", "value": {"x": 2}, "tags": {"ds": "math"}}])
        got = await asyncio.wait_for(waiting, 20)
        assert [it["key"] for it in got["items"]] == ["b"]


async def test_patch_sets_tags_and_filters_see_them(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(c, "t", _items(4))
        r = await c.post(
            "/v1/tables/t/items:patch",
            json={
                "items": [
                    {"key": "r2", "tags": {"ds": "math", "checked": True}},
                    {"key": "r3", "fields": {"reward": 1.0}, "tags": {"checked": False}},
                    {"key": "nope", "tags": {"ds": "x"}},
                ],
                "wait": True,
            },
        )
        assert r.status_code == 200 and r.json() == {"committed": 2, "missing": 1}, r.text
        r2 = (await c.get("/v1/tables/t/items/r2")).json()
        assert r2["tags"] == {"ds": "math", "level": 2, "hard": False, "checked": True}
        r3 = (await c.get("/v1/tables/t/items/r3")).json()
        assert r3["value"]["reward"] == 1.0 and r3["tags"]["checked"] is False
        got = await claim(
            c, "t", task="a", batch_size=4, where={"ds": "math"}, wait_ms=0, partial=True
        )
        assert [it["key"] for it in got["items"]] == ["r0", "r1", "r2"]
        r = await c.post("/v1/tables/t/items:patch", json={"items": [{"key": "r0"}]})
        assert r.status_code == 422, r.text


async def test_select_and_values_false(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(c, "t", _items(3))
        got = await claim(
            c, "t", task="a", batch_size=3, fields=["prompt", "tokens"], select=["tokens"]
        )
        values = [it["value"] for it in got["items"]]
        assert values == [{"tokens": list(range(i + 1))} for i in range(3)]
        meta = await claim(
            c, "t", task="b", batch_size=3, values=False, select=["tokens", "prompt"]
        )
        for i, it in enumerate(meta["items"]):
            assert "value" not in it
            assert it["lengths"] == {"tokens": i + 1, "prompt": i + 1}
            assert it["group"] == f"g{i // 2}" and it["version"] == i % 4 and "tags" in it


async def test_sample_with_where_draws_only_matches(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        r = await c.put("/v1/tables/t", json={"sampler": {"type": "uniform"}})
        assert r.status_code == 201
        await push(c, "t", _items(12))
        r = await c.post(
            "/v1/tables/t/sample", json={"batch_size": 64, "where": {"level": {"gte": 10}}}
        )
        assert r.status_code == 200, r.text
        assert {p["key"] for p in r.json()["items"]} == {"r10", "r11"}
        r = await c.post(
            "/v1/tables/t/sample",
            json={"batch_size": 1, "where": {"ds": "none"}, "timeout_ms": 100},
        )
        assert r.status_code == 504, r.text


@pytest.mark.parametrize(
    "where", [{"x": {"in": 3}}, {"x": {"gte": 1, "lte": "b"}}, {"x": {"near": 1}}, {"x": [1]}]
)
async def test_bad_filters_and_tags_are_refused(tmp_path: Path, where: Any) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        r = await c.post(
            "/v1/tables/t/claim", json={"task": "a", "batch_size": 1, "where": where, "wait_ms": 0}
        )
        assert r.status_code == 422, r.text
        many = {f"t{i}": i for i in range(17)}
        r = await c.post(
            "/v1/tables/t/items", json={"items": [{"key": "k", "value": 1, "tags": many}]}
        )
        assert r.status_code == 422, r.text
        r = await c.post(
            "/v1/tables/t/items", json={"items": [{"key": "k", "value": 1, "tags": {"a": [1]}}]}
        )
        assert r.status_code in (400, 422), r.text


async def test_tags_survive_a_restart(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(c, "t", _items(6))
        r = await c.post(
            "/v1/tables/t/items:patch",
            json={"items": [{"key": "r5", "tags": {"ds": "math"}}], "wait": True},
        )
        assert r.status_code == 200
    for _ in range(2):  # replayed from the log, then from the checkpoint
        async with serving(tmp_path) as c:
            got = await claim(
                c, "t", task="a", batch_size=6, where={"ds": "math"}, wait_ms=0, partial=True
            )
            assert [it["key"] for it in got["items"]] == ["r0", "r1", "r4", "r5"]
            assert (await c.get("/v1/tables/t/items/r5")).json()["tags"]["level"] == 5
