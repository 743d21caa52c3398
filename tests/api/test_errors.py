"""Every status and code of the contract's error table, in-process, with exact bodies."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest

from rlreplay.app.main import create_app
from rlreplay.app.settings import Settings
from rlreplay.wire.codec import packb

MSGPACK = "application/msgpack"


def assert_error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The answer is the contract's error body with that status and code."""
    assert r.status_code == status, r.text
    body = msgpack.unpackb(r.content) if r.headers["content-type"].startswith(MSGPACK) else r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


PUSH = "/v1/tables/default/items"
SAMPLE = "/v1/tables/default/sample"


@pytest.mark.parametrize(
    ("path", "content", "ctype"),
    [
        (PUSH, b"{not json", "application/json"),
        (PUSH, b"\xc1", MSGPACK),
        (PUSH, packb({"items": [{"key": "k", "value": 1}]})[:-1], MSGPACK),
        (PUSH, packb({"items": [{"key": "k", "value": 1}]}) + b"\x00", MSGPACK),
        (PUSH, packb([1, 2]), MSGPACK),
        (PUSH, b"[1, 2]", "application/json"),
        (PUSH, packb({"items": "x"}), MSGPACK),
        (PUSH, packb({"items": [{"key": b"bytes", "value": 1}]}), MSGPACK),
        (PUSH, packb({"items": [{"key": "k", "value": 1, "priority": "high"}]}), MSGPACK),
        (PUSH, b'{"items": [{"key": 5, "value": 1}]}', "application/json"),
        (PUSH, b'{"items": [], "wait": "yes"}', "application/json"),
        (PUSH, b'{"items": [{"key": "k", "value": {"$bytes": "!!"}}]}', "application/json"),
        (SAMPLE, b'{"batch_size": "8"}', "application/json"),
        (SAMPLE, b'{"batch_size": 1.5}', "application/json"),
        (SAMPLE, b"", "application/json"),
        ("/v1/tables/new", b'{"max_size": "big"}', "application/json"),
    ],
)
async def test_400_bad_request(
    client: httpx.AsyncClient, path: str, content: bytes, ctype: str
) -> None:
    method = "PUT" if path.startswith("/v1/tables/new") else "POST"
    r = await client.request(method, path, content=content, headers={"content-type": ctype})
    assert_error(r, 400, "bad_request")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (SAMPLE, {"batch_size": 0}),
        (SAMPLE, {"batch_size": 0.0}),
        (SAMPLE, {"batch_size": 8, "timeout_ms": -1}),
        (SAMPLE, {}),
        (SAMPLE, {"batch_size": 8, "typo": 1}),
        (PUSH, {"items": [{"key": "k", "value": 1, "priority": -1.0}]}),
        (PUSH, {"items": [{"key": "", "value": 1}]}),
        (PUSH, {"items": [{"key": "é" * 257, "value": 1}]}),
        (PUSH, {"items": [{"key": "k"}]}),
        (PUSH, {"itemz": []}),
        ("/v1/tables/default/priorities", {"priorities": {"k": -2.0}}),
        ("/v1/tables/default/items:batchGet", {"keys": ["x" * 513]}),
    ],
)
@pytest.mark.parametrize("fmt", ["json", "msgpack"])
async def test_422_validation_error(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], fmt: str
) -> None:
    if fmt == "json":
        r = await client.post(path, json=body)
    else:
        r = await client.post(
            path, content=packb(body), headers={"content-type": MSGPACK, "accept": MSGPACK}
        )
    assert_error(r, 422, "validation_error")


async def test_422_for_nan_priority_and_unknown_sampler(client: httpx.AsyncClient) -> None:
    r = await client.post(
        PUSH,
        content=b'{"items": [{"key": "k", "value": 1, "priority": NaN}]}',
        headers={"content-type": "application/json"},
    )
    assert_error(r, 422, "validation_error")
    r = await client.put("/v1/tables/x", json={"sampler": {"type": "no-such-sampler"}})
    assert_error(r, 422, "validation_error")
    r = await client.put("/v1/tables/bad%20name", json={})
    assert_error(r, 422, "validation_error")


async def test_404s(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/tables/ghost"), 404, "table_not_found")
    assert_error(
        await client.post("/v1/tables/ghost/items", json={"items": []}), 404, "table_not_found"
    )
    assert_error(await client.get("/v1/tables/default/items/ghost"), 404, "item_not_found")
    assert_error(await client.get("/v2/whatever"), 404, "not_found")
    r = await client.get("/v1/tables/ghost", headers={"accept": MSGPACK})
    assert_error(r, 404, "table_not_found")


async def test_405(client: httpx.AsyncClient) -> None:
    r = await client.patch("/v1/tables/default")
    assert_error(r, 405, "method_not_allowed")
    assert "PUT" in r.headers["allow"]


async def test_409(client: httpx.AsyncClient) -> None:
    r = await client.put("/v1/tables/default", json={"max_size": 3})
    assert_error(r, 409, "table_exists")


async def test_413_content_length_and_chunked(client: httpx.AsyncClient) -> None:
    big = b"x" * (1024 * 1024 + 1)
    r = await client.post(PUSH, content=big, headers={"content-type": "application/json"})
    assert_error(r, 413, "payload_too_large")

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b"y" * 65536

    r = await client.post(PUSH, content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert_error(r, 413, "payload_too_large")


async def test_415(client: httpx.AsyncClient) -> None:
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "application/xml"):
        r = await client.post(PUSH, content=b"{}", headers={"content-type": ctype})
        assert_error(r, 415, "unsupported_media_type")
    r = await client.post(PUSH, content=b"{}")
    assert_error(r, 415, "unsupported_media_type")


async def test_503_overloaded_has_retry_after(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, storage_mode="memory", write_queue_ops=2)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            items = [{"key": f"k{i}", "value": i} for i in range(2)]
            # Three items can never fit a queue of two: a permanent error, not a retryable one.
            r = await c.post(PUSH, json={"items": [*items, {"key": "k2", "value": 2}]})
            assert_error(r, 422, "validation_error")
            engine = app.state.engine
            from rlreplay.wire.errors import Overloaded

            async def full(*args: Any, **kwargs: Any) -> Any:
                raise Overloaded("the write queue is full", retry_after=2.5)

            engine.admission.push_answer = full  # what the route calls
            r = await c.post(PUSH, json={"items": items})
            assert_error(r, 503, "overloaded")
            assert r.headers["retry-after"] == "3"


async def test_503_until_ready(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path, storage_mode="memory"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.get("/readyz")  # lifespan not started: the engine is not ready
        assert_error(r, 503, "unavailable")
        assert int(r.headers["retry-after"]) >= 1
        assert (await c.get("/healthz")).status_code == 200


async def test_504_deadline_exceeded(client: httpx.AsyncClient) -> None:
    r = await client.put(
        "/v1/tables/limited", json={"rate_limiter": {"type": "min_size", "min_size": 5}}
    )
    assert r.status_code == 201
    await client.post("/v1/tables/limited/items", json={"items": [{"key": "a", "value": 1}]})
    r = await client.post("/v1/tables/limited/sample", json={"batch_size": 1, "timeout_ms": 50})
    assert_error(r, 504, "deadline_exceeded")


async def test_500_internal_is_logged_and_answered(
    app: Any, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("kaboom")

    app.state.engine.get = boom
    r = await client.get("/v1/tables/default/items/x")
    err = assert_error(r, 500, "internal")
    assert r.headers["x-request-id"] in err["message"]
    assert "kaboom" not in err["message"]
    assert any("kaboom" in (rec.exc_text or str(rec.exc_info)) for rec in caplog.records)


async def test_401_api_keys(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, storage_mode="memory", api_key=["alpha", "beta"])
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            for headers in (
                {},
                {"authorization": "Bearer wrong"},
                {"authorization": "alpha"},
                {"authorization": "Basic alpha"},
                {"authorization": "Bearer "},
            ):
                r = await c.get("/v1/tables", headers=headers)
                assert_error(r, 401, "unauthorized")
                assert r.headers["www-authenticate"] == "Bearer"
            for key in ("alpha", "beta"):
                r = await c.get("/v1/tables", headers={"authorization": f"Bearer {key}"})
                assert r.status_code == 200
            for path in ("/healthz", "/readyz", "/metrics", "/docs", "/redoc", "/openapi.json"):
                assert (await c.get(path)).status_code == 200, path
