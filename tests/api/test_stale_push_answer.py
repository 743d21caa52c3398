"""A push into a table with ``max_staleness`` answers the count of its items, the stale
ones it drops at once included, with or without a ``request_id`` (docs/api.md, "Versions":
"``accepted`` counts them"); a repeat of the id gets the same answer and drops nothing more."""

from __future__ import annotations

import httpx
import pytest

from tests.api.test_routes import call

# two stale items (version 0 < 5 - 1) and one fresh
ITEMS = [
    {"key": "old0", "value": {"x": 0}, "version": 0},
    {"key": "old1", "value": {"x": 1}, "version": 0},
    {"key": "new", "value": {"x": 2}, "version": 5},
]


async def _stale_table(client: httpx.AsyncClient, name: str, fmt: str) -> None:
    status, _, _ = await call(
        client, "PUT", f"/v1/tables/{name}", {"sampler": {"type": "fifo"}, "max_staleness": 1}
    )
    assert status == 201
    status, body, _ = await call(client, "PUT", f"/v1/tables/{name}/version", {"version": 5})
    assert status == 200, body


async def _dropped_stale(client: httpx.AsyncClient, name: str) -> int:
    status, body, _ = await call(client, "GET", f"/v1/tables/{name}/tasks")
    assert status == 200, body
    return int(body["dropped_stale"])


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
@pytest.mark.parametrize("wait", [False, True])
@pytest.mark.parametrize("request_id", [None, "push-1"])
async def test_a_push_counts_the_stale_items_it_drops(
    client: httpx.AsyncClient, fmt: str, wait: bool, request_id: str | None
) -> None:
    await _stale_table(client, "t", fmt)
    body: dict[str, object] = {"items": ITEMS, "wait": wait}
    if request_id is not None:
        body["request_id"] = request_id
    want = (200, {"committed": 3}) if wait else (202, {"accepted": 3})
    status, answer, _ = await call(client, "POST", "/v1/tables/t/items", body, fmt=fmt)
    assert (status, answer) == want
    assert await _dropped_stale(client, "t") == 2
    if request_id is not None:  # the repeat gets the first answer and changes nothing
        status, answer, _ = await call(client, "POST", "/v1/tables/t/items", body, fmt=fmt)
        assert (status, answer) == want
        assert await _dropped_stale(client, "t") == 2
    status, got, _ = await call(
        client, "POST", "/v1/tables/t/items:batchGet", {"keys": ["old0", "old1", "new"]}
    )
    assert status == 200
    assert [item is not None for item in got["items"]] == [False, False, True]


@pytest.mark.parametrize("request_id", [None, "push-2"])
async def test_a_push_of_stale_items_only_counts_them(
    client: httpx.AsyncClient, request_id: str | None
) -> None:
    await _stale_table(client, "t", "json")
    body: dict[str, object] = {"items": ITEMS[:2]}
    if request_id is not None:
        body["request_id"] = request_id
    status, answer, _ = await call(client, "POST", "/v1/tables/t/items", body)
    assert (status, answer) == (202, {"accepted": 2})
    assert await _dropped_stale(client, "t") == 2
