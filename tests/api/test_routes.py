"""Every route of the contract, in-process over ``httpx.ASGITransport``, in JSON and msgpack."""

from __future__ import annotations

import math
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest

from rlreplay.wire.codec import packb, unpackb

MSGPACK = "application/msgpack"


async def call(
    client: httpx.AsyncClient, method: str, path: str, body: Any = None, *, fmt: str = "json"
) -> tuple[int, Any, httpx.Response]:
    """Sends ``body`` as JSON or msgpack and decodes the answer in the same format."""
    headers: dict[str, str] = {}
    content: bytes | None = None
    if fmt == "msgpack":
        headers["accept"] = MSGPACK
        if body is not None:
            headers["content-type"] = MSGPACK
            content = packb(body)
        r = await client.request(method, path, content=content, headers=headers)
        assert r.headers.get("content-type", MSGPACK).startswith(MSGPACK) or not r.content
        return r.status_code, (unpackb(r.content) if r.content else None), r
    r = await client.request(method, path, json=body)
    if r.content:
        assert r.headers["content-type"].startswith("application/json")
    return r.status_code, (r.json() if r.content else None), r


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
async def test_table_lifecycle(client: httpx.AsyncClient, fmt: str) -> None:
    config = {"sampler": {"type": "prioritized", "exponent": 0.6}, "max_size": 100}
    status, body, _ = await call(client, "PUT", "/v1/tables/t1", config, fmt=fmt)
    assert status == 201
    assert body["name"] == "t1"
    assert body["config"]["sampler"]["type"] == "prioritized"
    assert body["config"]["max_size"] == 100
    for stat in (
        "size",
        "pending_ops",
        "bytes_in_cache",
        "bytes_on_disk",
        "inserts",
        "samples",
        "deletes",
        "evictions_to_disk",
        "populates",
    ):
        assert stat in body["stats"]
    status, _, _ = await call(client, "PUT", "/v1/tables/t1", config, fmt=fmt)
    assert status == 200
    status, body, _ = await call(client, "PUT", "/v1/tables/t1", {"max_size": 5}, fmt=fmt)
    assert (status, body["error"]["code"]) == (409, "table_exists")
    status, body, _ = await call(client, "GET", "/v1/tables", fmt=fmt)
    assert status == 200
    assert {t["name"] for t in body["tables"]} == {"default", "t1"}
    status, body, _ = await call(client, "GET", "/v1/tables/t1", fmt=fmt)
    assert (status, body["name"]) == (200, "t1")
    status, body, _ = await call(client, "DELETE", "/v1/tables/t1", fmt=fmt)
    assert (status, body) == (204, None)
    status, body, _ = await call(client, "GET", "/v1/tables/t1", fmt=fmt)
    assert (status, body["error"]["code"]) == (404, "table_not_found")


async def test_put_table_with_empty_body_uses_defaults(client: httpx.AsyncClient) -> None:
    r = await client.put("/v1/tables/plain")
    assert r.status_code == 201
    assert r.json()["config"]["sampler"]["type"] == "uniform"


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
async def test_push_get_sample_delete(client: httpx.AsyncClient, fmt: str) -> None:
    items = [
        {"key": f"ep/{i}", "value": {"obs": [i, i + 1], "reward": float(i)}, "priority": 1.0 + i}
        for i in range(5)
    ]
    status, body, _ = await call(
        client, "POST", "/v1/tables/default/items", {"items": items}, fmt=fmt
    )
    assert (status, body) == (202, {"accepted": 5})
    status, body, _ = await call(
        client, "POST", "/v1/tables/default/items", {"items": items[:1], "wait": True}, fmt=fmt
    )
    assert (status, body) == (200, {"committed": 1})
    status, body, _ = await call(client, "GET", "/v1/tables/default/items/ep/3", fmt=fmt)
    assert status == 200
    assert body["key"] == "ep/3"
    assert body["value"] == {"obs": [3, 4], "reward": 3.0}
    assert body["priority"] == 4.0
    assert body["times_sampled"] == 0
    assert body["inserted_at"] > 1e9
    status, body, _ = await call(
        client,
        "POST",
        "/v1/tables/default/items:batchGet",
        {"keys": ["ep/4", "nope", "ep/0"]},
        fmt=fmt,
    )
    assert status == 200
    assert [None if i is None else i["key"] for i in body["items"]] == ["ep/4", None, "ep/0"]
    status, body, _ = await call(
        client, "POST", "/v1/tables/default/sample", {"batch_size": 8}, fmt=fmt
    )
    assert status == 200
    assert len(body["items"]) == 8
    for pick in body["items"]:
        assert set(pick) == {"key", "value", "priority", "probability", "weight", "times_sampled"}
        assert pick["key"].startswith("ep/")
        assert pick["value"]["obs"][0] == int(pick["key"][3:])
        assert math.isclose(pick["probability"], 1 / 5)
        assert pick["weight"] == 1.0
    status, body, _ = await call(
        client,
        "POST",
        "/v1/tables/default/sample",
        {"batch_size": 2, "include_values": False},
        fmt=fmt,
    )
    assert status == 200
    assert all(p["value"] is None for p in body["items"])
    status, body, _ = await call(
        client,
        "POST",
        "/v1/tables/default/priorities",
        {"priorities": {"ep/0": 0.5, "ghost": 1.0}},
        fmt=fmt,
    )
    assert (status, body) == (200, {"updated": 1, "missing": 1})
    status, body, _ = await call(client, "GET", "/v1/tables/default/items/ep/0", fmt=fmt)
    assert body["priority"] == 0.5
    status, body, _ = await call(client, "DELETE", "/v1/tables/default/items/ep/0", fmt=fmt)
    assert (status, body) == (202, {"accepted": 1})
    status, body, _ = await call(client, "GET", "/v1/tables/default/items/ep/0", fmt=fmt)
    assert (status, body["error"]["code"]) == (404, "item_not_found")
    status, body, _ = await call(
        client, "POST", "/v1/tables/default/items:batchDelete", {"keys": ["ep/1", "ep/2"]}, fmt=fmt
    )
    assert (status, body) == (202, {"accepted": 2})
    status, body, _ = await call(
        client,
        "POST",
        "/v1/tables/default/items:batchGet",
        {"keys": ["ep/1", "ep/2", "ep/3"]},
        fmt=fmt,
    )
    assert [i is None for i in body["items"]] == [True, True, False]


async def test_msgpack_values_are_stored_byte_for_byte(client: httpx.AsyncClient) -> None:
    """A value's msgpack bytes come back exactly as sent (float32, arrays, odd encodings)."""
    arr = np.arange(12, dtype="<f4").reshape(3, 4)
    value = {"obs": arr, "f32": np.float32(0.1), "raw": b"\x00\xff"}
    value_bytes = packb(value)
    # A non-minimal encoding (uint64 for a small int) must survive too.
    odd_value = b"\xcf" + (7).to_bytes(8, "big")
    body = (
        b"\x82\xa5items\x92"
        + b"\x83\xa3key\xa2v1\xa5value"
        + value_bytes
        + b"\xa8priority\xcb"
        + b"\x40"
        + bytes(7)
        + b"\x82\xa3key\xa2v2\xa5value"
        + odd_value
        + b"\xa4wait\xc3"
    )
    r = await client.post(
        "/v1/tables/default/items", content=body, headers={"content-type": "application/x-msgpack"}
    )
    assert r.status_code == 200, r.text
    r = await client.post(
        "/v1/tables/default/items:batchGet",
        content=msgpack.packb({"keys": ["v1", "v2"]}),
        headers={"content-type": MSGPACK, "accept": MSGPACK},
    )
    assert value_bytes in r.content
    assert odd_value in r.content
    got = unpackb(r.content)["items"]
    assert np.array_equal(got[0]["value"]["obs"], arr)
    assert got[0]["value"]["obs"].dtype == np.dtype("<f4")
    assert got[0]["priority"] == 2.0
    assert got[1]["value"] == 7
    # The JSON form of the same value.
    r = await client.get("/v1/tables/default/items/v1")
    nd = r.json()["value"]["obs"]["$ndarray"]
    assert nd["dtype"] == "<f4" and nd["shape"] == [3, 4]
    assert r.json()["value"]["raw"] == {"$bytes": "AP8="}


async def test_json_push_of_tagged_values(client: httpx.AsyncClient) -> None:
    import base64

    data = np.array([1, 2, 3], dtype="<i8")
    value = {
        "a": {
            "$ndarray": {
                "dtype": "<i8",
                "shape": [3],
                "data": base64.b64encode(data.tobytes()).decode(),
            }
        },
        "b": {"$bytes": "AQI="},
    }
    r = await client.post(
        "/v1/tables/default/items",
        json={"items": [{"key": "tagged", "value": value}], "wait": True},
    )
    assert r.status_code == 200
    r = await client.get("/v1/tables/default/items/tagged", headers={"accept": MSGPACK})
    got = unpackb(r.content)["value"]
    assert np.array_equal(got["a"], data) and got["b"] == b"\x01\x02"


async def test_keys_with_slashes_and_unicode_in_the_path(client: httpx.AsyncClient) -> None:
    key = "run 1/ep?3/é#x"
    r = await client.post("/v1/tables/default/items", json={"items": [{"key": key, "value": 1}]})
    assert r.status_code == 202
    from urllib.parse import quote

    r = await client.get("/v1/tables/default/items/" + quote(key, safe="/"))
    assert r.status_code == 200, r.text
    assert r.json()["key"] == key


async def test_colon_routes_are_not_item_keys(client: httpx.AsyncClient) -> None:
    """``items:batchGet`` and ``items:batchDelete`` route to their own operations."""
    await client.post("/v1/tables/default/items", json={"items": [{"key": "k", "value": 1}]})
    r = await client.post("/v1/tables/default/items:batchGet", json={"keys": ["k"]})
    assert r.status_code == 200 and r.json()["items"][0]["key"] == "k"
    r = await client.get("/v1/tables/default/items:batchGet")
    assert (r.status_code, r.json()["error"]["code"]) == (405, "method_not_allowed")
    r = await client.post("/v1/tables/default/items:batchDelete", json={"keys": ["k"]})
    assert r.status_code == 202
    r = await client.post("/v1/tables/default/items:nope", json={"keys": ["k"]})
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")


async def test_health_ready_metrics(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).json() == {"status": "ready"}
    await client.post("/v1/tables/default/items", json={"items": [{"key": "m", "value": 1}]})
    await client.get("/v1/tables/default/items/m")
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert (
        "rlreplay_http_request_duration_seconds_count"
        '{method="GET",route="/v1/tables/{table}/items/{key}",status="200"} 1.0' in text
    )
    assert 'rlreplay_table_items{table="default"} 1.0' in text
    assert 'rlreplay_ops_total{kind="push_items",outcome="ok"} 1.0' in text
    assert 'rlreplay_items_total{kind="push"} 1.0' in text
    assert "rlreplay_write_queue_depth" in text


async def test_request_id_is_returned(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz", headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    r1, r2 = await client.get("/healthz"), await client.get("/healthz")
    assert r1.headers["x-request-id"] != r2.headers["x-request-id"]
    r = await client.get("/healthz", headers={"x-request-id": "bad id with spaces"})
    assert r.headers["x-request-id"] != "bad id with spaces"


async def test_access_log_is_one_json_line_per_request(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    import json

    from rlreplay.app.api.logs import JsonFormatter

    caplog.set_level("INFO", logger="rlreplay.access")
    await client.get("/v1/tables/nope", headers={"x-request-id": "req-42"})
    records = [r for r in caplog.records if r.name == "rlreplay.access"]
    assert len(records) == 1
    line = json.loads(JsonFormatter().format(records[0]))
    assert line["request_id"] == "req-42"
    assert line["status"] == 404
    assert line["error_code"] == "table_not_found"
    assert line["route"] == "/v1/tables/{table}"
    assert line["duration_ms"] >= 0


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
@pytest.mark.parametrize("first_waits", [False, True])
async def test_a_repeated_request_id_gets_the_first_answer_status_included(
    client: httpx.AsyncClient, fmt: str, first_waits: bool
) -> None:
    """Whatever the repeat's own ``wait`` says: the contract's "status included"."""
    rid = f"rid-{fmt}-{first_waits}-0123456789"
    first = (200, {"committed": 1}) if first_waits else (202, {"accepted": 1})
    path = "/v1/tables/default/items"
    push = {"items": [{"key": "once", "value": 1}], "request_id": rid, "wait": first_waits}
    status, answer, _ = await call(client, "POST", path, push, fmt=fmt)
    assert (status, answer) == first
    columns = {"keys": ["once"], "columns": {"x": np.zeros(1)}, "request_id": rid}
    for repeat in ({**push, "wait": not first_waits}, {**columns, "wait": not first_waits}):
        if fmt == "json" and "columns" in repeat:
            continue  # the JSON form of a column is the codec's, not call()'s plain JSON
        status, answer, _ = await call(client, "POST", path, repeat, fmt=fmt)
        assert (status, answer) == first
    delete = {"keys": ["once"], "request_id": rid, "wait": first_waits}
    status, answer, _ = await call(client, "POST", path + ":batchDelete", delete, fmt=fmt)
    assert (status, answer) == first
    delete["wait"] = not first_waits
    status, answer, _ = await call(client, "POST", path + ":batchDelete", delete, fmt=fmt)
    assert (status, answer) == first
    status, _, _ = await call(client, "GET", path + "/once", fmt=fmt)
    assert status == 404
