"""Faults against a real ``rlreplay serve``: refused requests change nothing, now or after
``kill -9``; a full disk is a state that writes come back from without a restart."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import msgpack
import pytest

from tests.faults.disk import fill, small_disk
from tests.live import LiveServer, start_server, stop_server

JSON = {"content-type": "application/json"}
MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


def kill(server: LiveServer) -> None:
    server.process.kill()
    server.process.wait(15)


async def _push(c: httpx.AsyncClient, key: str, value: bytes, table: str = "default") -> int:
    body = msgpack.packb({"items": [{"key": key, "value": value}]})
    r = await c.post(f"/v1/tables/{table}/items", content=body, headers=MSGPACK)
    assert r.status_code in (202, 503, 507), r.text
    return r.status_code


async def _metric(
    c: httpx.AsyncClient, series: str, until: Callable[[float], bool] = lambda v: v > 0
) -> float:
    """The value of one series in /metrics once ``until`` holds for it, or the last value
    seen after 30 s (answers are cached for 1 s)."""
    value = float("nan")
    for _ in range(300):
        for line in (await c.get("/metrics")).text.splitlines():
            if line.startswith(series + " "):
                value = float(line.split()[-1])
        if until(value):
            return value
        await asyncio.sleep(0.1)
    return value


async def _sample_answers_in_time(c: httpx.AsyncClient) -> None:
    """A sample with timeout_ms 200 answers (200, 504 or 503), and not long after its
    deadline: the bound is loose, as CI machines are loaded; a hang fails it."""
    started = time.monotonic()
    r = await c.post(
        "/v1/tables/default/sample", json={"batch_size": 4, "timeout_ms": 200}, timeout=30
    )
    assert r.status_code in (200, 503, 504), r.text
    assert time.monotonic() - started < 10


async def test_refused_configs_and_priorities_leave_the_log_whole(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            for i in range(20):
                assert await _push(c, f"before-{i}", b"x") == 202
            for body in (
                '{"max_size": 1000000000000000000000000000000}',
                '{"max_times_sampled": 18446744073709551616}',
                '{"rate_limiter": {"type": "min_size", "min_size": 18446744073709551616}}',
                '{"rate_limiter": {"type": "queue", "size": 100000000000000000000000}}',
            ):
                r = await c.put("/v1/tables/t1", content=body, headers=JSON)
                assert r.status_code == 422, r.text
                assert r.json()["error"]["code"] == "validation_error"
            huge = "1" + "0" * 400
            r = await c.post(
                "/v1/tables/default/items",
                content='{"items": [{"key": "huge", "value": 1, "priority": ' + huge + "}]}",
                headers=JSON,
            )
            assert r.status_code == 422, r.text
            assert "priority" in r.json()["error"]["message"]
            # writes answered after the refusals
            for i in range(100):
                assert await _push(c, f"after-{i}", b"y") == 202
            r = await c.post(
                "/v1/tables/default/items:batchDelete",
                json={"keys": [f"before-{i}" for i in range(10)]},
            )
            assert r.status_code == 202
            assert (await c.put("/v1/tables/t2", json={"max_size": 10})).status_code == 201
        kill(server)
        server = start_server(tmp_path)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            keys = [f"after-{i}" for i in range(100)] + [f"before-{i}" for i in range(20)]
            r = await c.post("/v1/tables/default/items:batchGet", json={"keys": keys})
            items = r.json()["items"]
            assert all(it is not None for it in items[:100])  # every answered push
            assert all(it is None for it in items[100:110])  # every answered delete
            assert all(it is not None for it in items[110:])
            assert (await c.get("/v1/tables/t2")).status_code == 200
            assert (await c.get("/v1/tables/t1")).status_code == 404
            assert (await c.get("/v1/tables/default/items/huge")).status_code == 404
        assert "replay stops" not in server.log() and "missing" not in server.log()
    finally:
        stop_server(server)


@pytest.mark.parametrize("wal_writer", ["thread", "process"])
async def test_a_full_disk_refuses_writes_and_they_come_back(
    tmp_path: Path, wal_writer: str
) -> None:
    """On a full disk, pushes and table creation answer 507 and are not applied; reads go
    on; writes work again once space is freed, with no restart; after kill -9 every
    answered write is back and no refused one is."""
    with small_disk(tmp_path / "disk", 48) as disk:
        flags = (
            *("--wal-checkpoint-mb", "2", "--cache-memory-limit-mb", "4"),
            *("--wal-writer", wal_writer),
        )
        server = start_server(tmp_path, *flags, data_dir=disk / "data")
        answered: list[str] = []
        refused: list[str] = []
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
                for i in range(50):
                    assert await _push(c, f"ok-{i}", bytes([i % 256]) * 20_000) == 202
                    answered.append(f"ok-{i}")
                filler = fill(disk)
                for i in range(400):  # until the log cannot take more
                    status = await _push(c, f"full-{i}", bytes([i % 256]) * 20_000)
                    (answered if status == 202 else refused).append(f"full-{i}")
                    if len(refused) >= 5:
                        break
                assert refused, "the disk never filled up"
                r = await c.put("/v1/tables/t2", json={"max_size": 100})
                assert r.status_code == 507, r.text
                body = r.json()["error"]
                assert body["code"] == "storage_full" and "full" in body["message"]
                # refused: not applied; reads go on
                assert (await c.get("/v1/tables/t2")).status_code == 404
                for key in refused:
                    assert (await c.get(f"/v1/tables/default/items/{key}")).status_code == 404
                r = await c.post("/v1/tables/default/items:batchGet", json={"keys": answered})
                assert r.status_code == 200
                assert all(it is not None for it in r.json()["items"])
                await _sample_answers_in_time(c)
                assert (await c.get("/healthz")).status_code == 200
                assert await _metric(c, 'rlreplay_storage_failures_total{kind="log_flush"}') >= 1
                # space comes back: writes work again by themselves
                filler.unlink()
                deadline = time.monotonic() + 60
                status = 0
                while status != 202 and time.monotonic() < deadline:
                    status = await _push(c, "back", b"z" * 1000)
                    if status != 202:
                        await asyncio.sleep(0.2)
                assert status == 202
                answered.append("back")
                r = await c.put("/v1/tables/t2", json={"max_size": 100})
                assert r.status_code == 201, r.text
                assert await _push(c, "in-t2", b"t", table="t2") == 202
                await _sample_answers_in_time(c)
                # background work that failed meanwhile (checkpoints, evictions) gets through
                assert await _metric(c, "rlreplay_storage_failing", until=lambda v: v == 0) == 0
            kill(server)
            server = start_server(tmp_path, *flags, data_dir=disk / "data")
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
                r = await c.post("/v1/tables/default/items:batchGet", json={"keys": answered})
                missing = [k for k, it in zip(answered, r.json()["items"], strict=True) if not it]
                assert missing == []
                r = await c.post("/v1/tables/default/items:batchGet", json={"keys": refused})
                assert r.json()["items"] == [None] * len(refused)
                assert (await c.get("/v1/tables/t2/items/in-t2")).status_code == 200
        finally:
            stop_server(server)


async def test_answers_past_the_cap_and_tables_past_the_limit_are_refused(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path, "--max-response-mb", "1", "--max-tables", "3")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            for i in range(40):
                assert await _push(c, f"big-{i}", bytes(100_000)) == 202
            started = time.monotonic()
            r = await c.post(
                "/v1/tables/default/sample", content=b'{"batch_size": 60000}', headers=JSON
            )
            assert r.status_code == 422, r.text
            assert "max-response-mb" in r.json()["error"]["message"]
            assert time.monotonic() - started < 10  # refused before it is built (loose bound)
            r = await c.post("/v1/tables/default/sample", json={"batch_size": 5})
            assert r.status_code == 200  # under the cap
            keys = [f"big-{i}" for i in range(40)]
            r = await c.post("/v1/tables/default/items:batchGet", json={"keys": keys})
            assert r.status_code == 422
            assert (await c.put("/v1/tables/t1", json={})).status_code == 201
            assert (await c.put("/v1/tables/t2", json={})).status_code == 201
            r = await c.put("/v1/tables/t3", json={})  # default, t1, t2 are the 3 allowed
            assert r.status_code == 507, r.text
            assert "--max-tables" in r.json()["error"]["message"]
            assert (await c.delete("/v1/tables/t1")).status_code == 204
            assert (await c.put("/v1/tables/t3", json={})).status_code == 201
    finally:
        stop_server(server)


async def test_sigterm_stops_within_seconds_while_a_sample_waits(tmp_path: Path) -> None:
    """A sample waiting a minute for an item does not hold a SIGTERM for that long."""
    server = start_server(tmp_path)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            await c.put("/v1/tables/empty", json={})
            waiting = asyncio.ensure_future(
                c.post("/v1/tables/empty/sample", json={"batch_size": 1, "timeout_ms": 60_000})
            )
            await asyncio.sleep(0.5)
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(server.process.wait, 60)
            assert time.monotonic() - started < 25  # uvicorn's 5 s grace, then the stop
            assert code in (0, -signal.SIGTERM)  # uvicorn ends by re-raising the signal
            with contextlib.suppress(httpx.HTTPError):
                await waiting
    finally:
        stop_server(server)
