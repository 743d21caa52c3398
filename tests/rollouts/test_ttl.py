"""``ttl_s`` over HTTP: unconsumed items past it are deleted by the engine's own task,
whole groups at a time, counted in the table's ``expired`` stat and in ``/metrics``; items
consumed in time are not counted; the count survives a restart."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.rollouts.inproc import claim, create, push, serving


async def _stats(c: httpx.AsyncClient, table: str = "t") -> dict:
    return dict((await c.get(f"/v1/tables/{table}")).json()["stats"])


async def _until(c: httpx.AsyncClient, expired: int, deadline_s: float = 30) -> dict:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        stats = await _stats(c)
        if stats["expired"] >= expired:
            return stats
        await asyncio.sleep(0.05)
    raise AssertionError(f"expired stayed at {(await _stats(c))['expired']}")


async def test_unconsumed_items_expire_whole_groups(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t", ttl_s=0.5, delete_after_ack=["trainer"])
        await push(
            c, "t", [{"key": f"r{i}", "value": {"x": i}, "group": f"g{i // 2}"} for i in range(4)]
        )
        # consumed in time: deleted on its ack, never counted as expired
        lease = await claim(c, "t", task="trainer", batch_size=2, group_size=2)
        await c.post(f"/v1/tables/t/leases/{lease['lease']}:ack")
        # a late member of g1 goes with its group
        await push(c, "t", [{"key": "late", "value": {"x": 9}, "group": "g1"}])
        stats = await _until(c, 3)
        assert stats["expired"] == 3 and stats["size"] == 0
        metrics = (await c.get("/metrics")).text
        assert 'rlreplay_items_expired_total{table="t"} 3' in metrics
        # what is pushed later lives its own ttl_s
        await push(c, "t", [{"key": "new", "value": 1}])
        assert (await c.get("/v1/tables/t/items/new")).status_code == 200
        await _until(c, 4)
    async with serving(tmp_path) as c:
        assert (await _stats(c))["expired"] == 4


async def test_a_table_without_ttl_keeps_its_items(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(c, "t", [{"key": "a", "value": 1}])
        engine = c.app.state.engine  # type: ignore[attr-defined]
        assert engine.item_expiry.sweep(now=time.time() + 10**6) == 0
        assert (await _stats(c))["size"] == 1


async def test_expiry_runs_from_the_engine_and_stops_with_it(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t", ttl_s=3600)
        await push(c, "t", [{"key": f"r{i}", "value": i} for i in range(3)])
        engine = c.app.state.engine  # type: ignore[attr-defined]
        assert engine.item_expiry.sweep(now=time.time() + 3601) == 3
        await _until(c, 3)
        r = await c.delete("/v1/tables/t")
        assert r.status_code == 204
    assert engine.item_expiry._task is None  # stopped with the engine
