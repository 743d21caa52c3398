"""Reservations over HTTP: granted within ``admission.max_ahead`` and the staleness window,
filled by pushes, returned by ``DELETE`` and by expiry, waits that wake without polling,
counted in ``/tasks`` and ``/metrics``, and returned by a restart."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from tests.rollouts.inproc import claim, create, push, serving


async def _reserve(c: httpx.AsyncClient, status: int = 201, **body: Any) -> Any:
    r = await c.post("/v1/tables/t/reservations", json=body)
    assert r.status_code == status, r.text
    return r.json()


async def _reserved(c: httpx.AsyncClient) -> int:
    answer = (await c.get("/v1/tables/t/tasks")).json()
    return int(answer["reserved"])


async def _paced(c: httpx.AsyncClient, max_ahead: int = 4, **config: Any) -> None:
    await create(c, "t", admission={"max_ahead": max_ahead}, delete_after_ack=["trainer"], **config)


async def test_slots_are_granted_within_max_ahead(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await _paced(c)
        first = await _reserve(c, count=3, version=0)
        assert first["granted"] == 3 and first["expires_at"] > time.time() + 500
        assert (await _reserve(c, count=3, version=0))["granted"] == 1
        err = await _reserve(c, 504, count=1, version=0, wait_ms=50)
        assert err["error"]["code"] == "deadline_exceeded"
        assert await _reserved(c) == 4
        # filled slots become items, which count until consumed
        await push(
            c,
            "t",
            [{"key": f"k{i}", "value": {"x": i}} for i in range(3)],
            reservation=first["reservation"],
        )
        assert await _reserved(c) == 1
        await _reserve(c, 504, count=1, version=0, wait_ms=50)


async def test_a_waiting_reservation_wakes_when_items_are_consumed(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await _paced(c, max_ahead=2)
        rid = (await _reserve(c, count=2, version=0))["reservation"]
        await push(c, "t", [{"key": f"k{i}", "value": {"x": i}} for i in range(2)], reservation=rid)
        waiting = asyncio.create_task(_reserve(c, count=5, version=0, wait_ms=30_000))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        lease = await claim(c, "t", task="trainer", batch_size=1)
        r = await c.post(f"/v1/tables/t/leases/{lease['lease']}:ack")
        assert r.status_code == 200
        got = await asyncio.wait_for(waiting, 20)
        assert got["granted"] == 1


async def test_delete_and_expiry_return_unfilled_slots(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await _paced(c, max_ahead=4)
        rid = (await _reserve(c, count=4, version=0))["reservation"]
        await push(c, "t", [{"key": "k0", "value": 0}], reservation=rid)
        r = await c.delete(f"/v1/tables/t/reservations/{rid}")
        assert r.status_code == 200 and r.json() == {"returned": 3}, r.text
        r = await c.delete(f"/v1/tables/t/reservations/{rid}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "lease_not_found"
        assert await _reserved(c) == 0
        # a push naming a returned reservation is kept, and fills nothing
        await push(c, "t", [{"key": "k1", "value": 1}], reservation=rid)
        short = await _reserve(c, count=2, version=0, ttl_s=0.3)
        assert short["granted"] == 2
        waiting = asyncio.create_task(_reserve(c, count=2, version=0, wait_ms=30_000))
        got = await asyncio.wait_for(waiting, 20)  # woken by the expiry of ``short``
        assert got["granted"] == 2
        assert await _reserved(c) == 2
        metrics = (await c.get("/metrics")).text
        assert 'rlreplay_reserved_slots{table="t"} 2' in metrics
        assert 'rlreplay_reservation_slots_returned_total{table="t"} 5' in metrics


async def test_stale_versions_are_refused(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await _paced(c, max_staleness=2)
        r = await c.put("/v1/tables/t/version", json={"version": 10})
        assert r.status_code == 200
        err = await _reserve(c, 409, count=1, version=7)
        assert err["error"]["code"] == "version_conflict"
        assert (await _reserve(c, count=1, version=8))["granted"] == 1


async def test_a_table_without_admission_grants_every_slot(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        assert (await _reserve(c, count=1000, version=0))["granted"] == 1000
        r = await c.post("/v1/tables/t/reservations", json={"count": 0, "version": 0})
        assert r.status_code == 422
        r = await c.post("/v1/tables/nope/reservations", json={"count": 1, "version": 0})
        assert r.status_code == 404


async def test_a_restart_returns_reservations_and_keeps_fills(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await _paced(c, max_ahead=3)
        rid = (await _reserve(c, count=3, version=0))["reservation"]
        await push(c, "t", [{"key": "k0", "value": 0}], reservation=rid)
    async with serving(tmp_path) as c:
        assert await _reserved(c) == 0
        assert (await c.get("/v1/tables/t/items/k0")).status_code == 200
        r = await c.delete(f"/v1/tables/t/reservations/{rid}")
        assert r.status_code == 404
        assert (await _reserve(c, count=5, version=0))["granted"] == 2


async def test_the_clients_reserve_fill_claim_by_tokens_and_return(
    server_url: str, table: str
) -> None:
    from rlreplay import Client, ReplayClient, ShardedReplayClient

    async with ReplayClient(server_url) as rb:
        await rb.create_table(
            table,
            sampler={"type": "fifo"},
            admission={"max_ahead": 8},
            delete_after_ack=["trainer"],
            ttl_s=3600,
        )
        got = await rb.reserve(table, 4, version=0)
        assert got.granted == 4
        items = [
            {
                "key": f"r{i}",
                "value": {"tokens": [1] * (i + 1)},
                "group": f"g{i // 2}",
                "tags": {"ds": "math"},
            }
            for i in range(4)
        ]
        assert await rb.push(table, items, wait=True, reservation=got.id) == 4
        assert (await rb.tasks(table))["reserved"] == 0
        await rb.patch(table, [{"key": "r3", "tags": {"ds": "code"}}], wait=True)
        lease = await rb.claim(
            table,
            task="trainer",
            batch_size=4,
            group_size=2,
            max_tokens=3,
            length_field="tokens",
            world_size=2,
            where={"ds": "math"},
        )
        assert lease.keys == ["r0", "r1"] and lease.ranks == [[0, 1], []]  # one group
        await lease.ack()
    async with ShardedReplayClient([server_url]) as sharded:
        got = await sharded.reserve(table, 3, version=0)
        assert got.granted == 3 and got.id.startswith("0:")
        await sharded.push(table, [{"key": "s0", "value": {"tokens": [1]}}], reservation=got.id)
        assert await sharded.return_reservation(table, got.id) == 2
    with Client(server_url) as sync:
        got = sync.reserve(table, 1, version=0)
        assert sync.return_reservation(table, got.id) == 1
        lease = sync.claim(table, task="meta", batch_size=1, values=False, select=["tokens"])
        assert lease.items[0]["lengths"] == {"tokens": 3}  # r2: r0 and r1 are consumed
