"""Against a real ``rlreplay serve`` subprocess on 127.0.0.1: raw HTTP and the client."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import psutil
import pytest

from rlreplay.clients import ReplayClient
from rlreplay.wire.codec import packb, unpackb
from rlreplay.wire.errors import DeadlineExceeded, Overloaded, TableNotFound, Unauthorized
from tests.live import LiveServer, launch_server, running_server, stop_server

MSGPACK = "application/msgpack"


async def wire(
    c: httpx.AsyncClient, method: str, path: str, body: Any = None, *, fmt: str
) -> tuple[int, Any]:
    if fmt == "msgpack":
        headers = {"accept": MSGPACK}
        if body is not None:
            headers["content-type"] = MSGPACK
        r = await c.request(
            method, path, content=None if body is None else packb(body), headers=headers
        )
        return r.status_code, unpackb(r.content) if r.content else None
    r = await c.request(method, path, json=body)
    return r.status_code, r.json() if r.content else None


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
async def test_every_route_over_the_wire(live: LiveServer, fmt: str) -> None:
    table = f"wire-{fmt}"
    base = f"/v1/tables/{table}"
    async with httpx.AsyncClient(base_url=live.url) as c:
        assert await wire(c, "GET", "/healthz", fmt=fmt) == (200, {"status": "ok"})
        assert await wire(c, "GET", "/readyz", fmt=fmt) == (200, {"status": "ready"})
        status, body = await wire(c, "PUT", base, {"sampler": {"type": "fifo"}}, fmt=fmt)
        assert status == 201 and body["config"]["sampler"]["type"] == "fifo"
        assert (await wire(c, "PUT", base, {"sampler": {"type": "fifo"}}, fmt=fmt))[0] == 200
        status, body = await wire(c, "GET", "/v1/tables", fmt=fmt)
        assert table in {t["name"] for t in body["tables"]}
        items = [{"key": f"a/{i}", "value": {"i": i}, "priority": 1.0} for i in range(4)]
        assert await wire(c, "POST", f"{base}/items", {"items": items}, fmt=fmt) == (
            202,
            {"accepted": 4},
        )
        assert await wire(
            c, "POST", f"{base}/items", {"items": items[:1], "wait": True}, fmt=fmt
        ) == (200, {"committed": 1})
        status, body = await wire(c, "GET", f"{base}/items/a/2", fmt=fmt)
        assert status == 200 and body["value"] == {"i": 2}
        status, body = await wire(
            c, "POST", f"{base}/items:batchGet", {"keys": ["a/3", "x"]}, fmt=fmt
        )
        assert body["items"][0]["value"] == {"i": 3} and body["items"][1] is None
        status, body = await wire(c, "POST", f"{base}/sample", {"batch_size": 2}, fmt=fmt)
        assert status == 200 and len(body["items"]) == 2
        assert await wire(
            c, "POST", f"{base}/priorities", {"priorities": {"a/1": 3.0}}, fmt=fmt
        ) == (200, {"updated": 1, "missing": 0})
        assert await wire(c, "DELETE", f"{base}/items/a/1", fmt=fmt) == (202, {"accepted": 1})
        assert (await wire(c, "GET", f"{base}/items/a/1", fmt=fmt))[0] == 404
        assert await wire(c, "POST", f"{base}/items:batchDelete", {"keys": ["a/2"]}, fmt=fmt) == (
            202,
            {"accepted": 1},
        )
        status, body = await wire(c, "GET", base, fmt=fmt)
        assert body["stats"]["size"] == 2
        # A scrape reuses a rendering up to --metrics-cache-s (1 s) old: poll, bounded.
        deadline = time.monotonic() + 10
        while (
            f'rlreplay_table_items{{table="{table}"}} 2.0'
            not in (r := await c.get("/metrics")).text
        ):
            assert time.monotonic() < deadline, r.text
            await asyncio.sleep(0.1)
        assert await wire(c, "DELETE", base, fmt=fmt) == (204, None)
        status, body = await wire(c, "GET", base, fmt=fmt)
        assert (status, body["error"]["code"]) == (404, "table_not_found")


async def test_client_round_trip(live: LiveServer) -> None:
    obs = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    async with ReplayClient(live.url) as rb:
        await rb.create_table("client", sampler={"type": "prioritized", "exponent": 0.6})
        n = await rb.push(
            "client",
            [
                {"key": "r1", "value": {"obs": obs, "r": 1.0}, "priority": 2.0},
                {"key": "r2", "value": {"obs": obs * 2, "r": 0.0}},
            ],
        )
        assert n == 2
        item = await rb.get("client", "r1")
        assert item is not None and np.array_equal(item["value"]["obs"], obs)
        assert item["value"]["obs"].dtype == np.float32
        assert await rb.get("client", "nope") is None
        got = await rb.get_many("client", ["r2", "nope"])
        assert got[1] is None and np.array_equal(got[0]["value"]["obs"], obs * 2)
        batch = await rb.sample("client", batch_size=16)
        assert len(batch) == 16 and {b["key"] for b in batch} <= {"r1", "r2"}
        assert all(0 < b["weight"] <= 1.0 for b in batch)
        assert await rb.update_priorities("client", {"r1": 0.5, "zz": 1}) == {
            "updated": 1,
            "missing": 1,
        }
        assert await rb.delete("client", ["r1"]) == 1
        assert await rb.get("client", "r1") is None
        with pytest.raises(TableNotFound):
            await rb.sample("ghost", batch_size=1)
        await rb.drop_table("client")


async def test_read_your_writes_from_8_concurrent_clients(live: LiveServer) -> None:
    """A push answered 202 is visible at once to every other client, as are deletes."""
    clients = [httpx.AsyncClient(base_url=live.url) for _ in range(8)]
    try:
        r = await clients[0].put("/v1/tables/ryw", json={"sampler": {"type": "lifo"}})
        assert r.status_code == 201

        async def worker(w: int) -> None:
            me, other = clients[w], clients[(w + 1) % 8]
            for i in range(15):
                key = f"w{w}/{i}"
                value = packb({"w": w, "i": i, "blob": bytes(256)})
                r = await me.post(
                    "/v1/tables/ryw/items",
                    content=b"\x81\xa5items\x91\x82\xa3key"
                    + msgpack.packb(key)
                    + b"\xa5value"
                    + value,
                    headers={"content-type": MSGPACK},
                )
                assert r.status_code == 202, r.text
                r = await other.get(f"/v1/tables/ryw/items/{key}", headers={"accept": MSGPACK})
                assert r.status_code == 200, (key, r.text)
                assert unpackb(r.content)["value"]["i"] == i
                r = await other.post("/v1/tables/ryw/sample", json={"batch_size": 1})
                assert r.status_code == 200
                if i % 3 == 0:
                    r = await me.delete(f"/v1/tables/ryw/items/{key}")
                    assert r.status_code == 202
                    r = await other.post("/v1/tables/ryw/items:batchGet", json={"keys": [key]})
                    assert r.json()["items"] == [None], key

        await asyncio.wait_for(asyncio.gather(*(worker(w) for w in range(8))), timeout=60)
        r = await clients[0].get("/v1/tables/ryw")
        assert r.json()["stats"]["size"] == 8 * 10
    finally:
        for c in clients:
            await c.aclose()


async def test_413_over_the_wire(live: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live.url) as c:
        r = await c.post(
            "/v1/tables/default/items",
            content=b"x" * (1024 * 1024 + 10),
            headers={"content-type": "application/json"},
        )
        assert (r.status_code, r.json()["error"]["code"]) == (413, "payload_too_large")

        async def chunks() -> Any:
            for _ in range(20):
                yield b" " * 65536

        r = await c.post(
            "/v1/tables/default/items",
            content=chunks(),
            headers={"content-type": "application/json"},
        )
        assert (r.status_code, r.json()["error"]["code"]) == (413, "payload_too_large")
        # Just under the limit is fine.
        value = b"z" * (1024 * 1024 - 200)
        r = await c.post(
            "/v1/tables/default/items",
            content=packb({"items": [{"key": "big", "value": value}]}),
            headers={"content-type": MSGPACK},
        )
        assert r.status_code == 202, r.text


async def test_504_deadline_exceeded_over_the_wire(live: LiveServer) -> None:
    async with ReplayClient(live.url, retries=0) as rb:
        await rb.create_table("slow", rate_limiter={"type": "min_size", "min_size": 3})
        await rb.push("slow", [{"key": "only", "value": 1}])
        with pytest.raises(DeadlineExceeded):
            await rb.sample("slow", batch_size=1, timeout_ms=100)
        await rb.push("slow", [{"key": f"k{i}", "value": i} for i in range(3)])
        assert len(await rb.sample("slow", batch_size=2, timeout_ms=1000)) == 2


async def test_api_keys_over_the_wire(live_keys: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live_keys.url) as c:
        r = await c.get("/v1/tables")
        assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized")
        r = await c.get("/v1/tables", headers={"authorization": "Bearer key-two"})
        assert r.status_code == 200
        for path in ("/healthz", "/readyz", "/metrics", "/docs", "/openapi.json"):
            assert (await c.get(path)).status_code == 200
    async with ReplayClient(live_keys.url, api_key="wrong", retries=0) as rb:
        with pytest.raises(Unauthorized):
            await rb.list_tables()
    async with ReplayClient(live_keys.url, api_key="key-one") as rb:
        assert await rb.push("default", [{"key": "k", "value": 1}]) == 1


async def test_503_overloaded_and_nothing_accepted_is_lost(tmp_path: Path) -> None:
    """A tiny write queue answers 503 with Retry-After; every 202 push is kept."""
    with running_server(tmp_path, "--write-queue-ops", "8", "--storage-mode", "hybrid") as srv:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=srv.url, limits=limits, timeout=30) as c:

            async def push(n: int) -> tuple[int, list[str], httpx.Response]:
                keys = [f"b{n}/{j}" for j in range(4)]
                body = {"items": [{"key": k, "value": {"n": n, "pad": "x" * 2000}} for k in keys]}
                r = await c.post("/v1/tables/default/items", json=body)
                return r.status_code, keys, r

            results: list[tuple[int, list[str], httpx.Response]] = []
            for _ in range(20):  # bounded: at most 20 rounds of 48 concurrent pushes
                results += await asyncio.gather(*(push(len(results) + i) for i in range(48)))
                if any(s == 503 for s, _, _ in results):
                    break
            statuses = {s for s, _, _ in results}
            assert statuses <= {202, 503}, statuses
            assert 503 in statuses, "the write queue never filled up"
            rejected = next(r for s, _, r in results if s == 503)
            assert rejected.json()["error"]["code"] == "overloaded"
            assert int(rejected.headers["retry-after"]) >= 1
            accepted = [k for s, keys, _ in results if s == 202 for k in keys]
            refused = [k for s, keys, _ in results if s == 503 for k in keys]
            r = await c.post("/v1/tables/default/items:batchGet", json={"keys": accepted})
            assert all(item is not None for item in r.json()["items"])
            r = await c.post("/v1/tables/default/items:batchGet", json={"keys": refused})
            assert all(item is None for item in r.json()["items"])
        async with ReplayClient(srv.url, retries=0) as rb:
            outcomes = await asyncio.gather(
                *(
                    rb.push("default", [{"key": f"c{i}/{j}", "value": j} for j in range(4)])
                    for i in range(64)
                ),
                return_exceptions=True,
            )
            for outcome in outcomes:
                assert outcome == 4 or isinstance(outcome, Overloaded), outcome
                if isinstance(outcome, Overloaded):
                    assert outcome.retry_after is not None and outcome.retry_after >= 1


async def test_sigterm_drains_and_data_survives_a_restart(tmp_path: Path) -> None:
    with running_server(tmp_path, "--storage-mode", "hybrid") as srv:
        async with ReplayClient(srv.url) as rb:
            await rb.push("default", [{"key": f"k{i}", "value": {"i": i}} for i in range(200)])
        # uvicorn shuts down gracefully, then re-raises SIGTERM: exit code 0 or -15.
        assert stop_server(srv) in (0, -15)
        log = srv.log()
    assert '"logger": "rlreplay.access"' in log
    assert "Application shutdown complete" in log
    assert "Traceback" not in log
    with running_server(tmp_path, "--storage-mode", "hybrid") as srv2:
        async with ReplayClient(srv2.url) as rb:
            got = await rb.get_many("default", [f"k{i}" for i in range(200)])
            assert [g["value"]["i"] for g in got if g is not None] == list(range(200))


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
async def test_the_log_writer_process_ends_with_the_server_and_loses_nothing_answered(
    tmp_path: Path, stop: str
) -> None:
    flags = ("--storage-mode", "hybrid", "--wal-writer", "process")
    with running_server(tmp_path, *flags) as srv:
        async with ReplayClient(srv.url) as rb:
            for n in range(20):  # the first flush settles O_DIRECT in a thread, then the process
                await rb.push("default", [{"key": f"k{n}.{i}", "value": i} for i in range(10)])
        server = psutil.Process(srv.process.pid)
        writers = [
            p for p in server.children() if "rlreplay.workers.log_writer_process" in p.cmdline()
        ]
        assert len(writers) == 1, [p.cmdline() for p in server.children()]
        assert "flushes in a log writer process" in srv.log()
        if stop == "sigterm":
            assert stop_server(srv) in (0, -15)
            assert "Traceback" not in srv.log()
        else:
            srv.process.kill()
            srv.process.wait(10)
        writers[0].wait(10)  # it exits by itself once the server is gone
    with running_server(tmp_path, *flags) as srv2:
        async with ReplayClient(srv2.url) as rb:
            keys = [f"k{n}.{i}" for n in range(20) for i in range(10)]
            got = await rb.get_many("default", keys)
            assert all(g is not None for g in got)


async def _wait_for_status(server: LiveServer, path: str, timeout_s: float = 30) -> None:
    """Polls ``path`` (a bounded loop) until it answers 200."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as c:
        while time.monotonic() < deadline:
            assert server.process.poll() is None, f"server exited:\n{server.log()}"
            with contextlib.suppress(httpx.HTTPError):
                if (await c.get(path)).status_code == 200:
                    return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{path} not 200 within {timeout_s} s:\n{server.log()}")


async def test_probes_answer_while_recovering_and_calls_wait_for_it(tmp_path: Path) -> None:
    """The server listens during recovery: /healthz 200, /readyz and /v1 503 unavailable."""
    with running_server(tmp_path, "--storage-mode", "hybrid") as srv:
        async with ReplayClient(srv.url) as rb:
            await rb.push("default", [{"key": f"k{i}", "value": i} for i in range(50)])
    # Recovery waits for the log folder's lock (held by a dying server's log writer, in
    # real life): holding it keeps the next server recovering for as long as we like.
    lock = os.open(srv.data_dir / "wal" / "LOCK", os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)
    srv2 = launch_server(tmp_path, "--storage-mode", "hybrid")
    try:
        try:
            await _wait_for_status(srv2, "/healthz")
            async with httpx.AsyncClient(base_url=srv2.url, timeout=10) as c:
                for method, path, body in [
                    ("GET", "/readyz", None),
                    ("GET", "/v1/tables", None),
                    ("GET", "/v1/tables/default/items/k1", None),
                    ("POST", "/v1/tables/default/items", {"items": [{"key": "new", "value": 1}]}),
                    ("POST", "/v1/tables/default/sample", {"batch_size": 1}),
                ]:
                    r = await c.request(method, path, json=body)
                    assert r.status_code == 503, (path, r.text)
                    assert r.json()["error"]["code"] == "unavailable", (path, r.text)
                assert (await c.get("/metrics")).status_code == 200
                assert (await c.get("/healthz")).json() == {"status": "ok"}
        finally:
            os.close(lock)  # recovery goes on
        await _wait_for_status(srv2, "/readyz")
        async with ReplayClient(srv2.url) as rb:
            got = await rb.get_many("default", [f"k{i}" for i in range(50)])
            assert [g["value"] for g in got if g is not None] == list(range(50))
            assert await rb.push("default", [{"key": "new", "value": 1}]) == 1
    finally:
        assert stop_server(srv2) in (0, -15)
    assert "Traceback" not in srv2.log()


def test_a_failed_recovery_ends_the_server_with_status_3(tmp_path: Path) -> None:
    """A server whose recovery fails does not linger answering /healthz: it exits, 3."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rocksdb").write_text("not a database")
    srv = launch_server(tmp_path, "--storage-mode", "hybrid")
    try:
        assert srv.process.wait(60) == 3
    finally:
        stop_server(srv)
    assert "recovery failed" in srv.log()
