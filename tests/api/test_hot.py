"""The hot path (``rlreplay.app.api.hot``) answers exactly as FastAPI's routes do.

The same requests go to two in-process apps, one serving the data routes through the hot
path and one through FastAPI alone; status, headers that matter, bodies and the request
metrics must match. Requests cover every hot operation, both body formats, and the
errors: malformed bodies, wrong types, unknown tables, bad table names, wrong media types.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgpack
import pytest

from rlreplay.app.main import create_app
from rlreplay.app.settings import Settings

MP = {"content-type": "application/msgpack", "accept": "application/msgpack"}
JS = {"content-type": "application/json"}

REQUESTS: list[tuple[str, dict[str, str], bytes]] = [
    (
        "/v1/tables/t/items",
        MP,
        msgpack.packb(
            {"items": [{"key": f"k{i}", "value": {"i": i}, "priority": 1.0 + i} for i in range(8)]}
        ),
    ),
    ("/v1/tables/t/items", JS, b'{"items": [{"key": "j", "value": {"$bytes": "AAE="}}]}'),
    ("/v1/tables/t/items", MP, msgpack.packb({"items": [{"key": "w", "value": 1}], "wait": True})),
    ("/v1/tables/t/items:batchGet", MP, msgpack.packb({"keys": ["k1", "j", "nope", "w"]})),
    ("/v1/tables/t/items:batchGet", JS, b'{"keys": ["k2", "j"]}'),
    ("/v1/tables/t/priorities", MP, msgpack.packb({"priorities": {"k1": 5.0, "zz": 1.0}})),
    ("/v1/tables/t/sample", MP, msgpack.packb({"batch_size": 3})),
    ("/v1/tables/t/sample", JS, b'{"batch_size": 2, "include_values": false}'),
    ("/v1/tables/t/items:batchDelete", MP, msgpack.packb({"keys": ["k0", "zz"], "wait": True})),
    ("/v1/tables/t/items:batchDelete", JS, b'{"keys": ["k3"]}'),
    # errors
    ("/v1/tables/t/items", MP, msgpack.packb({"items": [{"key": "a"}]})),  # 422
    ("/v1/tables/t/items", MP, msgpack.packb({"items": [{"key": 1, "value": 1}]})),  # 400
    ("/v1/tables/t/items", MP, msgpack.packb({"items": [{"key": "a", "value": 1}]})[:-3]),
    ("/v1/tables/t/items", MP, b""),
    ("/v1/tables/t/items", {"content-type": "text/plain"}, b"hello"),  # 415
    ("/v1/tables/t/items", {}, b"{}"),  # no content type: 415
    ("/v1/tables/t/items", JS, b"{not json"),
    ("/v1/tables/t/items", MP, msgpack.packb({"items": [{"key": "x" * 600, "value": 1}]})),
    ("/v1/tables/missing/items", MP, msgpack.packb({"items": [{"key": "a", "value": 1}]})),
    ("/v1/tables/-bad/items", MP, msgpack.packb({"items": [{"key": "a", "value": 1}]})),
    ("/v1/tables/t/sample", MP, msgpack.packb({"batch_size": 0})),
    ("/v1/tables/t/sample", JS, b'{"batch_size": "3"}'),
    ("/v1/tables/missing/sample", JS, b'{"batch_size": 3}'),
    ("/v1/tables/t/priorities", JS, b'{"priorities": {"k1": -1}}'),
    ("/v1/tables/t/items:batchGet", MP, msgpack.packb({"keys": "k1"})),
    ("/v1/tables/t/items:batchGet", MP, msgpack.packb([1, 2])),
    ("/v1/tables/t/items:batchDelete", JS, b'{"keys": [], "extra": 1}'),
    ("/v1/tables/t/items:nope", JS, b'{"keys": []}'),
    ("/v1/tables/t/items", MP, b"\xc1" * 10),
]


@pytest.fixture
async def clients(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    opened = []
    for hot in (True, False):
        settings = Settings(
            data_dir=tmp_path / f"data-{hot}", storage_mode="memory", max_request_mb=1, seed=7
        )
        application = create_app(settings, hot_routes=hot)
        lifespan = application.router.lifespan_context(application)
        await lifespan.__aenter__()
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application), base_url="http://testserver"
        )
        r = await client.put("/v1/tables/t", json={"sampler": {"type": "fifo"}})
        assert r.status_code == 201, r.text
        opened.append((client, lifespan))
    yield opened[0][0], opened[1][0]
    for client, lifespan in opened:
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


def _untimed(obj: object) -> object:
    """``obj`` without the ``inserted_at`` times (the two apps push at different instants)."""
    if isinstance(obj, dict):
        return {k: _untimed(v) for k, v in obj.items() if k != "inserted_at"}
    if isinstance(obj, list):
        return [_untimed(v) for v in obj]
    return obj


def _answer(r: httpx.Response) -> tuple[int, str | None, object, str | None]:
    body: object = r.content
    if r.headers.get("content-type") == "application/msgpack":
        body = msgpack.unpackb(r.content)
    elif r.headers.get("content-type") == "application/json":
        body = r.json()
    return (
        r.status_code,
        r.headers.get("content-type"),
        _untimed(body),
        r.headers.get("retry-after"),
    )


async def test_hot_path_answers_as_fastapi_does(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    hot, plain = clients
    statuses = set()
    for path, headers, body in REQUESTS:
        a = await hot.post(path, content=body, headers=headers)
        b = await plain.post(path, content=body, headers=headers)
        assert _answer(a) == _answer(b), (path, headers, body[:40])
        assert a.headers["x-request-id"] and a.headers["content-length"] == str(len(a.content))
        statuses.add(a.status_code)
    assert {200, 202, 400, 404, 415, 422} <= statuses


async def test_hot_path_records_the_same_metrics(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    hot, plain = clients
    for path, headers, body in REQUESTS:
        await hot.post(path, content=body, headers=headers)
        await plain.post(path, content=body, headers=headers)

    def counters(text: str) -> list[str]:
        keep = re.compile(r"^rlreplay_(requests|ops|items)\w*_total\{")
        return sorted(line for line in text.splitlines() if keep.match(line))

    got_hot = counters((await hot.get("/metrics")).text)
    got_plain = counters((await plain.get("/metrics")).text)
    assert got_hot and got_hot == got_plain
