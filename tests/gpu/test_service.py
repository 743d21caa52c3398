"""The sidecar's HTTP app in process: the contract's error bodies, and readiness that
waits for the table."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import msgpack
import pytest
from starlette.applications import Starlette

from rlreplay.clients import ReplayClient
from rlreplay.gpu.service import SidecarConfig, create_sidecar_app


@pytest.fixture
async def sidecar(rb: ReplayClient) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    app = create_sidecar_app(
        SidecarConfig("http://unused", "later", "cpu", retry_s=0.02), client=rb
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as c:
            yield app, c


async def wait_ready(c: httpx.AsyncClient) -> None:
    for _ in range(1000):
        if (await c.get("/readyz")).status_code == 200:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the sidecar never became ready")


async def test_not_ready_until_the_table_exists(
    rb: ReplayClient, sidecar: tuple[Starlette, httpx.AsyncClient]
) -> None:
    _, c = sidecar
    assert (await c.get("/healthz")).status_code == 200
    early = await c.post("/v1/sample", json={"batch_size": 2})
    assert early.status_code == 503 and early.json()["error"]["code"] == "unavailable"
    assert (await c.get("/readyz")).status_code == 503
    await rb.create_table("later", sampler={"type": "uniform"})
    await rb.push("later", [{"key": "a", "value": {"x": 1.0}}], wait=True)
    await wait_ready(c)
    answer = await c.post(
        "/v1/sample",
        content=msgpack.packb({"batch_size": 3, "fields": ["x"]}),
        headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
    )
    assert answer.status_code == 200
    body = msgpack.unpackb(answer.content)
    assert body["keys"] == ["a", "a", "a"]


@pytest.mark.parametrize(
    ("content", "content_type", "status", "code"),
    [
        (b'{"batch_size": 2}', "text/plain", 415, "unsupported_media_type"),
        (b"{not json", "application/json", 400, "bad_request"),
        (b'{"batch_size": 0}', "application/json", 422, "validation_error"),
        (b'{"batch_size": 2, "strategy": "best"}', "application/json", 422, "validation_error"),
        (b'{"batch_size": 2, "fields": ["nope"]}', "application/json", 422, "validation_error"),
        (b'{"batch_size": 2, "extra": 1}', "application/json", 422, "validation_error"),
    ],
)
async def test_bad_requests_get_the_contracts_errors(
    rb: ReplayClient,
    sidecar: tuple[Starlette, httpx.AsyncClient],
    content: bytes,
    content_type: str,
    status: int,
    code: str,
) -> None:
    _, c = sidecar
    await rb.create_table("later", sampler={"type": "uniform"})
    await rb.push("later", [{"key": "a", "value": {"x": 1.0}}], wait=True)
    await wait_ready(c)
    r = await c.post("/v1/sample", content=content, headers={"content-type": content_type})
    assert r.status_code == status, r.content
    assert r.json()["error"]["code"] == code
