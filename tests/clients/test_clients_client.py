"""ReplayClient against an in-memory fake of the contract (no network)."""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Any

import httpx
import msgspec
import numpy as np
import pytest
import torch

from rlreplay.clients import ReplayClient, TableExists, TableNotFound, ValidationFailed
from rlreplay.wire.codec import packb, to_jsonable, unpackb
from rlreplay.wire.schemas import (
    DeleteRequest,
    KeysRequest,
    PrioritiesRequest,
    PushRequest,
    SampleRequest,
)
from tests.clients.replay_fake import FakeServer, answer


async def test_tables_lifecycle(client: ReplayClient) -> None:
    created = await client.create_table("t", max_size=10)
    config = created["config"]
    assert "sampler" not in config  # the server's default, as for PUT {}
    assert config["max_size"] == 10 and "remover" not in config
    await client.create_table("t", max_size=10)  # same config: fine
    with pytest.raises(TableExists):
        await client.create_table("t", max_size=11)
    assert [t["name"] for t in await client.list_tables()] == ["t"]
    assert (await client.describe_table("t"))["stats"]["size"] == 0
    await client.drop_table("t")
    with pytest.raises(TableNotFound):
        await client.describe_table("t")
    assert await client.list_tables() == []


async def test_items_lifecycle(client: ReplayClient) -> None:
    await client.create_table("t", sampler={"type": "uniform"}, remover={"type": "fifo"})
    obs = np.arange(12, dtype="<f4").reshape(3, 4)
    assert await client.push("t", [{"key": "a", "value": {"obs": obs}, "priority": 2.0}]) == 1
    assert await client.push("t", [{"key": "b", "value": 1}], wait=True) == 1
    assert await client.push("t", []) == 0

    item = await client.get("t", "a")
    assert item is not None and item["priority"] == 2.0 and item["times_sampled"] == 0
    np.testing.assert_array_equal(item["value"]["obs"], obs)
    assert item["value"]["obs"].dtype == np.dtype("<f4")
    assert await client.get("t", "missing") is None

    many = await client.get_many("t", ["b", "missing", "a"])
    assert [i and i["key"] for i in many] == ["b", None, "a"]

    batch = await client.sample("t", batch_size=5)
    assert len(batch) == 5 and {i["key"] for i in batch} <= {"a", "b"}
    assert all("value" in i and "weight" in i for i in batch)
    bare = await client.sample("t", batch_size=2, include_values=False, timeout_ms=100)
    assert all("value" not in i for i in bare)

    assert await client.update_priorities("t", {"a": 0.5, "zz": 1}) == {"updated": 1, "missing": 1}
    assert (await client.get("t", "a") or {})["priority"] == 0.5
    assert await client.delete("t", ["a", "zz"]) == 2
    assert await client.delete("t", []) == 0
    assert await client.get("t", "a") is None


async def test_missing_table_raises_even_for_get(client: ReplayClient) -> None:
    with pytest.raises(TableNotFound):
        await client.get("nope", "k")
    with pytest.raises(TableNotFound):
        await client.push("nope", [{"key": "k", "value": 1}])


async def test_validation_errors_are_raised_without_retry(
    client: ReplayClient, fake: FakeServer
) -> None:
    await client.create_table("t")
    before = len(fake.requests)
    with pytest.raises(ValidationFailed):
        await client.sample("t", batch_size=0)
    assert len(fake.requests) == before + 1


async def test_tensors_round_trip_through_the_client(client: ReplayClient) -> None:
    await client.create_table("t")
    tensor = torch.randn(2, 3, dtype=torch.float32).T  # not contiguous
    bf16 = torch.randn(4, dtype=torch.bfloat16)
    await client.push("t", [{"key": "k", "value": {"x": tensor, "y": bf16}}])
    item = await client.get("t", "k")
    assert item is not None
    assert torch.equal(torch.from_numpy(item["value"]["x"]), tensor)
    assert torch.equal(item["value"]["y"].to_torch().view(torch.int16), bf16.view(torch.int16))


@pytest.mark.parametrize(
    "key", ["a/b", "a?b=c#d", "100%", "sp ace", "ünï", "x:batchGet", ".", "..", "a/../b"]
)
async def test_keys_are_percent_encoded_into_one_segment(
    client: ReplayClient, fake: FakeServer, key: str
) -> None:
    await client.create_table("tab/le")
    await client.push("tab/le", [{"key": key, "value": key}])
    item = await client.get("tab/le", key)
    assert item is not None and item["value"] == key
    raw_path = fake.requests[-1].url.raw_path.decode()
    assert raw_path.startswith("/v1/tables/tab%2Fle/items/")
    assert raw_path.count("/") == 5


async def test_empty_names_are_refused_before_sending(client: ReplayClient) -> None:
    with pytest.raises(ValueError):
        await client.get("t", "")
    with pytest.raises(ValueError):
        await client.describe_table("")


async def test_headers_say_msgpack_and_carry_the_api_key() -> None:
    seen: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer(request, 202, {"accepted": 1})

    async with ReplayClient(
        "http://x", api_key="s3cret", transport=httpx.MockTransport(handler)
    ) as rb:
        await rb.push("t", [{"key": "k", "value": np.zeros(2)}])
    (request,) = seen
    assert request.headers["Accept"] == "application/msgpack"
    assert request.headers["Content-Type"] == "application/msgpack"
    assert request.headers["Authorization"] == "Bearer s3cret"
    body = unpackb(request.content)
    assert body["wait"] is False and body["items"][0]["key"] == "k"
    np.testing.assert_array_equal(body["items"][0]["value"], np.zeros(2))


async def test_request_bodies_decode_with_the_servers_schemas() -> None:
    """The client encodes with the wire Structs the server decodes with; values go as
    the codec packs them."""
    sent: dict[str, bytes] = {}
    pushes: list[bytes] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        sent[request.url.path.rsplit("/", 1)[1]] = request.content
        if request.url.path.endswith("/items"):
            pushes.append(request.content)
        return answer(request, 200, {"accepted": 1, "items": [], "updated": 1, "missing": 0})

    value = {"obs": np.arange(3, dtype="<f4"), "t": torch.ones(2), "r": np.float32(0.5)}
    async with ReplayClient("http://x", transport=httpx.MockTransport(handler)) as rb:
        await rb.push("t", [{"key": "a", "value": value, "priority": np.float64(2.0)}])
        await rb.push("t", [{"key": "b", "value": [1, "x"]}], wait=True)
        await rb.get_many("t", ["a", "b"])
        await rb.delete("t", ("a",))
        await rb.sample("t", 8, timeout_ms=50, include_values=False)
        await rb.update_priorities("t", {"a": 1})
    first, second = (msgspec.msgpack.decode(body, type=PushRequest) for body in pushes)
    assert first.wait is False and [(it.key, it.priority) for it in first.items] == [("a", 2.0)]
    assert bytes(first.items[0].value) == packb(value)
    assert second.wait is True and [(it.key, it.priority) for it in second.items] == [("b", 1.0)]
    assert bytes(second.items[0].value) == packb([1, "x"])
    assert msgspec.msgpack.decode(sent["items:batchGet"], type=KeysRequest).keys == ["a", "b"]
    assert msgspec.msgpack.decode(sent["items:batchDelete"], type=DeleteRequest).keys == ["a"]
    assert msgspec.msgpack.decode(sent["sample"], type=SampleRequest) == SampleRequest(8, 50, False)
    priorities = msgspec.msgpack.decode(sent["priorities"], type=PrioritiesRequest)
    assert priorities.priorities == {"a": 1.0}


async def test_a_push_item_with_a_field_missing_or_unknown_is_refused_before_sending() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing should be sent")

    async with ReplayClient("http://x", transport=httpx.MockTransport(handler)) as rb:
        for items, message in (
            ([{"key": "a", "value": 1}, {"key": "b"}], "missing field(s) in items[1]: value"),
            ([{"value": 1}], "missing field(s) in items[0]: key"),
            ([{"key": "a", "value": 1, "prio": 2.0}], "unknown field(s) in items[0]: prio"),
        ):
            with pytest.raises(ValidationFailed, match=re.escape(message)):
                await rb.push("t", items)


async def test_json_answers_are_decoded_from_the_json_form() -> None:
    value = {"obs": np.arange(3, dtype="<i2"), "raw": b"\x01"}

    async def handler(request: httpx.Request) -> httpx.Response:
        item = {"key": "k", "value": value, "priority": 1.0}
        content = json.dumps(to_jsonable(item)).encode()
        return httpx.Response(200, content=content, headers={"Content-Type": "application/json"})

    async with ReplayClient("http://x", transport=httpx.MockTransport(handler)) as rb:
        item = await rb.get("t", "k")
    assert item is not None and item["value"]["raw"] == b"\x01"
    assert item["value"]["obs"].dtype == np.dtype("<i2")


async def test_json_answers_decode_nonfinite_floats() -> None:
    content = (
        b'{"key":"k","value":{"r":[{"$float":"NaN"},{"$float":"Infinity"}],'
        b'"d":{"$float":"-Infinity"}},"priority":1.0}'
    )

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=content, headers={"Content-Type": "application/json"})

    async with ReplayClient("http://x", transport=httpx.MockTransport(handler)) as rb:
        item = await rb.get("t", "k")
    assert item is not None
    nan, inf = item["value"]["r"]
    assert math.isnan(nan) and inf == math.inf and item["value"]["d"] == -math.inf


async def test_health(client: ReplayClient) -> None:
    assert await client.health() is True

    async def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with ReplayClient("http://x", transport=httpx.MockTransport(down)) as rb:
        assert await rb.health() is False


async def test_sample_read_timeout_outlasts_the_rate_limiter_wait() -> None:
    timeouts: list[dict[str, Any]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"])
        return answer(request, 200, {"items": []})

    async with ReplayClient(
        "http://x", timeout_s=2.0, transport=httpx.MockTransport(handler)
    ) as rb:
        await rb.sample("t", 1, timeout_ms=60_000)
        await rb.get_many("t", [])
    assert timeouts[0]["read"] >= 60.0 and timeouts[0]["connect"] == 2.0
    assert timeouts[1]["read"] == 2.0


def test_constructor_validates_eagerly() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        ReplayClient(max_connections=0)
    with pytest.raises(ValueError, match="timeout_s"):
        ReplayClient(timeout_s=0)
    with pytest.raises(ValueError, match="retries"):
        ReplayClient(retries=-1)


async def test_no_more_than_max_connections_requests_are_in_flight() -> None:
    in_flight = most = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.005)
        in_flight -= 1
        return answer(request, 200, {"items": []})

    async with ReplayClient(
        "http://x", max_connections=3, transport=httpx.MockTransport(handler)
    ) as rb:
        await asyncio.gather(*(rb.sample("t", 1) for _ in range(20)))
    assert most == 3
