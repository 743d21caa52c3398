"""Snapshots against a real ``rlreplay serve``: to S3 (moto's server on 127.0.0.1) and to a
``file://`` URL, then ``kill -9`` and a new server on an empty data dir with
``--restore latest`` finds everything back."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import msgpack
import pytest

from tests.live import LiveServer, start_server, stop_server
from tests.s3server import create_bucket, start_moto
from tests.tables.test_state_restart import LIMITED

PRIORITIZED = {"sampler": {"type": "prioritized", "exponent": 0.7}, "max_size": 1000}
MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


def kill(server: LiveServer) -> None:
    server.process.kill()
    server.process.wait(15)


def _fill(client: httpx.Client) -> dict[str, object]:
    """Two tables, one prioritized and one rate-limited at its bound; what they hold."""
    assert client.put("/v1/tables/prio", json=PRIORITIZED).status_code == 201
    assert client.put("/v1/tables/limited", json=LIMITED).status_code == 201
    items = [
        {"key": f"p{i}", "value": {"i": i, "x": [i] * 3}, "priority": i + 0.5} for i in range(40)
    ]
    assert client.post("/v1/tables/prio/items", json={"items": items, "wait": True}).is_success
    limited = [{"key": f"l{i}", "value": i} for i in range(6)]
    assert client.post("/v1/tables/limited/items", json={"items": limited, "wait": True}).is_success
    assert _sample(client, "limited", 10).status_code == 200
    assert _sample(client, "limited", 1).status_code == 504  # held by the limiter
    return _contents(client)


def _sample(client: httpx.Client, table: str, n: int) -> httpx.Response:
    return client.post(f"/v1/tables/{table}/sample", json={"batch_size": n, "timeout_ms": 300})


def _contents(client: httpx.Client) -> dict[str, object]:
    prio = client.post(
        "/v1/tables/prio/items:batchGet", json={"keys": [f"p{i}" for i in range(40)]}
    )
    tables = {t["name"]: t["config"] for t in client.get("/v1/tables").json()["tables"]}
    stats = client.get("/v1/tables/limited").json()["stats"]
    return {
        "prio": [(i["key"], i["value"], i["priority"]) for i in prio.json()["items"]],
        "configs": tables,
        "limited_counts": (stats["inserts"], stats["samples"], stats["size"]),
    }


def _check_back(client: httpx.Client, before: dict[str, object]) -> None:
    assert _contents(client) == before
    assert _sample(client, "limited", 1).status_code == 504  # the limiter's counts came back
    one = {"items": [{"key": "l-new", "value": 1}], "wait": True}
    assert client.post("/v1/tables/limited/items", json=one).is_success
    assert _sample(client, "limited", 1).status_code == 200


@pytest.fixture(scope="module")
def s3() -> object:
    server, endpoint = start_moto()
    try:
        yield endpoint
    finally:
        server.stop()


def _s3_env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }


def test_s3_snapshot_then_kill_then_restore_on_an_empty_node(tmp_path: Path, s3: str) -> None:
    env = _s3_env(s3)
    create_bucket(s3, "trial-bucket")
    url = "s3://trial-bucket/run-1"
    flags = ("--backup-url", url, "--backup-interval-s", "0")
    first = start_server(tmp_path / "a", *flags, env=env)
    try:
        with httpx.Client(base_url=first.url, timeout=60) as client:
            before = _fill(client)
            r = client.post("/v1/snapshots", json={})
            assert r.status_code == 201, r.text
            snap = r.json()
            assert snap["items"] == 40 + 6 + 0  # the default table is empty
            assert snap["url"].startswith(url) and snap["bytes"] > 0
            listed = client.get("/v1/snapshots").json()["snapshots"]
            assert [s["id"] for s in listed] == [snap["id"]]
            assert set(listed[0]["tables"]) == {"default", "prio", "limited"}
            metrics = client.get("/metrics").text
            assert "rlreplay_snapshots_total 1.0" in metrics
    finally:
        kill(first)
    second = start_server(tmp_path / "b", *flags, "--restore", "latest", env=env)
    try:
        with httpx.Client(base_url=second.url, timeout=60) as client:
            _check_back(client, before)
        assert snap["id"] in second.log()
    finally:
        stop_server(second)


def test_periodic_file_snapshots_restore_after_kill(tmp_path: Path) -> None:
    url = (tmp_path / "backups").as_uri()
    flags = ("--backup-url", url, "--backup-interval-s", "2")
    first = start_server(tmp_path / "a", *flags)
    try:
        with httpx.Client(base_url=first.url, timeout=60) as client:
            before = _fill(client)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # a periodic snapshot taken after the fill
                listed = client.get("/v1/snapshots").json()["snapshots"]
                if listed and listed[0]["items"] == 46:
                    break
                time.sleep(0.2)
            else:
                pytest.fail(f"no periodic snapshot in 60 s:\n{first.log()}")
    finally:
        kill(first)
    second = start_server(tmp_path / "b", *flags, "--restore", "latest")
    try:
        with httpx.Client(base_url=second.url, timeout=60) as client:
            _check_back(client, before)
    finally:
        stop_server(second)


def test_no_backup_url_is_409_not_configured(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for r in (client.post("/v1/snapshots"), client.get("/v1/snapshots")):
                assert r.status_code == 409
                assert r.json()["error"]["code"] == "not_configured"
            bad = client.post("/v1/snapshots", json={"tables": ["missing"]})
            assert bad.status_code == 409  # no URL comes first
            assert client.post("/v1/snapshots", json={"tables": 3}).status_code == 400
    finally:
        stop_server(server)


PUSH_BOUND_S = 5.0  # loose on purpose: CI machines are loaded; bench/ measures the real pause


async def test_pushes_go_on_during_a_large_snapshot(tmp_path: Path) -> None:
    url = (tmp_path / "backups").as_uri()
    server = start_server(
        tmp_path, "--backup-url", url, "--backup-interval-s", "0", "--cache-memory-limit-mb", "512"
    )
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            value = os.urandom(1 << 20)
            for batch in range(8):  # 256 MB of values
                body = msgpack.packb(
                    {"items": [{"key": f"big{batch}-{i}", "value": value} for i in range(32)]}
                )
                r = await c.post("/v1/tables/default/items", content=body, headers=MSGPACK)
                assert r.status_code == 202, r.text
            snapshot = asyncio.create_task(c.post("/v1/snapshots"))
            waits: list[float] = []
            pushed = 0
            small = os.urandom(4096)
            while not snapshot.done() and pushed < 20_000:
                began = time.monotonic()
                body = msgpack.packb({"items": [{"key": f"during{pushed}", "value": small}]})
                r = await c.post("/v1/tables/default/items", content=body, headers=MSGPACK)
                assert r.status_code == 202, r.text
                waits.append(time.monotonic() - began)
                pushed += 1
            answer = await snapshot
            assert answer.status_code == 201, answer.text
            assert answer.json()["bytes"] >= 256 << 20
            assert pushed > 0 and max(waits) < PUSH_BOUND_S, (pushed, max(waits))
            got = await c.post(
                "/v1/tables/default/items:batchGet", json={"keys": [f"during{pushed - 1}"]}
            )
            assert got.json()["items"][0] is not None
    finally:
        stop_server(server)


async def test_the_python_client_takes_and_lists_snapshots(tmp_path: Path) -> None:
    from rlreplay import NotConfigured, ReplayClient, TableNotFound

    url = (tmp_path / "backups").as_uri()
    server = start_server(tmp_path / "a", "--backup-url", url, "--backup-interval-s", "0")
    plain = start_server(tmp_path / "b")
    try:
        async with ReplayClient(server.url) as rb:
            await rb.push("default", [{"key": "k", "value": {"x": 1}}], wait=True)
            taken = await rb.snapshot()
            assert taken["items"] == 1 and taken["tables"] == ["default"]
            assert [s["id"] for s in await rb.snapshots()] == [taken["id"]]
            with pytest.raises(TableNotFound):
                await rb.snapshot(["missing"])
        async with ReplayClient(plain.url) as rb:
            with pytest.raises(NotConfigured):
                await rb.snapshot()
    finally:
        stop_server(server)
        stop_server(plain)
