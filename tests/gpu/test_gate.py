"""The sidecar's own bearer keys and its request size limit, in process: the server's rules
and the contract's error bodies, before the app reads a byte of the body."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgpack
import pytest

from rlreplay.clients import ReplayClient
from rlreplay.gpu.service import SidecarConfig, create_sidecar_app

KEYS = ("alpha-key", "beta-key")
SAMPLE = msgpack.packb({"batch_size": 3, "fields": ["x"]})
MSGPACK = {"content-type": "application/msgpack"}


def bearer(key: str) -> dict[str, str]:
    return {**MSGPACK, "authorization": f"Bearer {key}"}


async def open_sidecar(rb: ReplayClient, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    await rb.create_table("t", sampler={"type": "uniform"})
    await rb.push("t", [{"key": "a", "value": {"x": 1.0}}], wait=True)
    config = SidecarConfig("http://unused", "t", "cpu", retry_s=0.02, **options)
    app = create_sidecar_app(config, client=rb)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as c:
            for _ in range(1000):
                if (await c.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.01)
            yield c


@pytest.fixture
async def keyed(rb: ReplayClient) -> AsyncIterator[httpx.AsyncClient]:
    async for c in open_sidecar(rb, api_keys=KEYS):
        yield c


@pytest.mark.parametrize(
    "headers",
    [
        MSGPACK,
        bearer("wrong"),
        bearer(""),
        {**MSGPACK, "authorization": "Basic alpha-key"},
        {**MSGPACK, "authorization": "Bearer alpha-key-and-more"},
    ],
    ids=["none", "wrong", "empty", "basic", "prefix"],
)
async def test_a_missing_or_bad_key_is_401(
    keyed: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    r = await keyed.post("/v1/sample", content=SAMPLE, headers=headers)
    assert r.status_code == 401, r.content
    assert r.json()["error"]["code"] == "unauthorized"
    assert "Bearer" in r.json()["error"]["message"]


@pytest.mark.parametrize("key", KEYS)
async def test_any_configured_key_is_let_through(keyed: httpx.AsyncClient, key: str) -> None:
    r = await keyed.post("/v1/sample", content=SAMPLE, headers=bearer(key))
    assert r.status_code == 200, r.content
    assert r.json()["keys"] == ["a", "a", "a"]


async def test_probes_and_metrics_stay_open(keyed: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await keyed.get(path)).status_code == 200, path


async def test_metrics_can_require_a_key(rb: ReplayClient) -> None:
    async for c in open_sidecar(rb, api_keys=KEYS, metrics_require_key=True):
        assert (await c.get("/metrics")).status_code == 401
        assert (await c.get("/metrics", headers=bearer(KEYS[1]))).status_code == 200
        assert (await c.get("/healthz")).status_code == 200


async def test_without_keys_nothing_is_asked(rb: ReplayClient) -> None:
    async for c in open_sidecar(rb):
        assert (await c.post("/v1/sample", content=SAMPLE, headers=MSGPACK)).status_code == 200


async def test_a_body_over_the_limit_is_413(rb: ReplayClient) -> None:
    async for c in open_sidecar(rb, max_request_bytes=1024):
        padded = msgpack.packb({"batch_size": 3, "fields": ["x"] + ["y" * 100] * 20})
        assert len(padded) > 1024
        r = await c.post("/v1/sample", content=padded, headers=MSGPACK)
        assert r.status_code == 413, r.content
        assert r.json()["error"]["code"] == "payload_too_large"
        assert r.headers["connection"] == "close"

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(100):
                yield b"x" * 100

        r = await c.post("/v1/sample", content=chunks(), headers=MSGPACK)
        assert r.status_code == 413, r.content
        assert r.json()["error"]["code"] == "payload_too_large"

        async def small() -> AsyncIterator[bytes]:
            yield SAMPLE[:5]
            yield SAMPLE[5:]

        r = await c.post("/v1/sample", content=small(), headers=MSGPACK)
        assert r.status_code == 200, r.content
        r = await c.post("/v1/sample", content=SAMPLE, headers=MSGPACK)
        assert r.status_code == 200, r.content
