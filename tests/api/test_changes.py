"""The change feed and index a follower (the GPU sidecar) keeps a table's selection state by.

A follower that loads ``/index`` and applies the events after its ``seq`` in order holds
exactly the server's keys, priorities and insertion times, whatever mix of pushes,
overwrites, deletes, priority updates, ``max_size`` trims and ``max_times_sampled``
removals happened; past the ring it is told 410 ``gone``, and a new feed (table dropped and
created again) has another epoch.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from rlreplay.app.settings import Settings
from rlreplay.app.tables.changes import ChangeFeed
from rlreplay.wire.codec import unpackb
from rlreplay.wire.errors import Gone

MSGPACK = {"accept": "application/msgpack"}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data", storage_mode="memory", durability="none", changes_keep=50
    )


async def get(client: httpx.AsyncClient, path: str) -> Any:
    r = await client.get(path, headers=MSGPACK)
    assert r.status_code == 200, r.content
    return unpackb(r.content)


async def post(client: httpx.AsyncClient, path: str, body: Any) -> Any:
    r = await client.post(path, json=body)
    assert r.status_code < 300, r.content
    return r.json()


def state_of(index: dict[str, Any]) -> dict[str, tuple[float, float]]:
    prios, times = index["priorities"].tolist(), index["inserted_at"].tolist()
    return {k: (p, t) for k, p, t in zip(index["keys"], prios, times, strict=True)}


def apply(model: dict[str, tuple[float, float]], events: list[dict[str, Any]]) -> None:
    for e in events:
        if e["op"] == "put":
            model.pop(e["key"], None)  # a put moves the key to the newest end
            model[e["key"]] = (e["priority"], e["inserted_at"])
        elif e["op"] == "delete":
            model.pop(e["key"], None)
        elif e["key"] in model:
            model[e["key"]] = (e["priority"], model[e["key"]][1])


async def follow(
    client: httpx.AsyncClient, table: str, model: dict[str, tuple[float, float]], since: int
) -> int:
    """Applies every event after ``since`` to ``model``, a page at a time; the new since."""
    while True:
        page = await get(client, f"/v1/tables/{table}/changes?since={since}&limit=7")
        apply(model, page["events"])
        if page["events"]:
            assert [e["seq"] for e in page["events"]] == list(
                range(since + 1, since + 1 + len(page["events"]))
            )
            since = page["events"][-1]["seq"]
        if since == page["seq"]:
            return since


async def test_a_follower_of_the_feed_holds_the_servers_state(client: httpx.AsyncClient) -> None:
    config = {"sampler": {"type": "prioritized"}, "remover": {"type": "fifo"}, "max_size": 30}
    await client.put("/v1/tables/t", json={**config, "max_times_sampled": 3})
    start = await get(client, "/v1/tables/t/index")
    assert start["keys"] == [] and start["seq"] == 0
    model: dict[str, tuple[float, float]] = {}
    since = 0
    rng = random.Random(5)
    for round_ in range(12):
        keys = [f"k{rng.randrange(60)}" for _ in range(rng.randrange(1, 9))]
        items = [{"key": k, "value": round_, "priority": rng.uniform(0.1, 4)} for k in keys]
        await post(client, "/v1/tables/t/items", {"items": items, "wait": True})
        gone = [f"k{rng.randrange(60)}" for _ in range(3)]
        await post(client, "/v1/tables/t/items:batchDelete", {"keys": gone, "wait": True})
        prios = {f"k{rng.randrange(60)}": rng.uniform(0, 3) for _ in range(4)}
        await post(client, "/v1/tables/t/priorities", {"priorities": prios})
        await post(client, "/v1/tables/t/sample", {"batch_size": 8, "include_values": False})
        since = await follow(client, "t", model, since)
    index = await get(client, "/v1/tables/t/index")
    assert index["seq"] == since
    assert list(model) == index["keys"]  # the same keys, in insertion order
    assert model == state_of(index)
    assert len(model) <= 30


async def test_events_name_every_kind_of_removal(client: httpx.AsyncClient) -> None:
    await client.put("/v1/tables/q", json={"sampler": {"type": "fifo"}, "max_times_sampled": 1})
    await get(client, "/v1/tables/q/index")  # start following
    await post(client, "/v1/tables/q/items", {"items": [{"key": "a", "value": 1}], "wait": True})
    await post(client, "/v1/tables/q/sample", {"batch_size": 1})  # used up: deleted
    await post(client, "/v1/tables/q/items", {"items": [{"key": "b", "value": 1}], "wait": True})
    page = await get(client, "/v1/tables/q/changes?since=0")
    assert [(e["op"], e["key"]) for e in page["events"]] == [
        ("put", "a"),
        ("delete", "a"),
        ("put", "b"),
    ]


async def test_past_the_ring_or_another_feed_is_gone(client: httpx.AsyncClient) -> None:
    index = await get(client, "/v1/tables/default/index")
    items = [{"key": f"x{i}", "value": i} for i in range(120)]  # changes_keep is 50
    await post(client, "/v1/tables/default/items", {"items": items[:60], "wait": True})
    await post(client, "/v1/tables/default/items", {"items": items[60:], "wait": True})
    r = await client.get(f"/v1/tables/default/changes?since={index['seq']}")
    assert r.status_code == 410 and r.json()["error"]["code"] == "gone"
    ahead = await client.get("/v1/tables/default/changes?since=1000")
    assert ahead.status_code == 410
    again = await get(client, "/v1/tables/default/index")
    assert again["seq"] == 120 and len(again["keys"]) == 120
    # a table dropped and created again is a new feed
    await client.delete("/v1/tables/default")
    await client.put("/v1/tables/default", json={})
    fresh = await get(client, "/v1/tables/default/index")
    assert fresh["epoch"] != again["epoch"] and fresh["seq"] == 0


async def test_a_long_poll_returns_on_the_next_event(client: httpx.AsyncClient) -> None:
    index = await get(client, "/v1/tables/default/index")
    empty = await get(client, f"/v1/tables/default/changes?since={index['seq']}&wait_ms=50")
    assert empty["events"] == []
    poll = asyncio.create_task(
        get(client, f"/v1/tables/default/changes?since={index['seq']}&wait_ms=60000")
    )
    await asyncio.sleep(0.05)
    assert not poll.done()
    await post(client, "/v1/tables/default/items", {"items": [{"key": "late", "value": 1}]})
    page = await asyncio.wait_for(poll, 30)
    assert [e["key"] for e in page["events"]] == ["late"]


async def test_bad_parameters_are_refused(client: httpx.AsyncClient) -> None:
    for query in ("since=-1", "limit=0", "wait_ms=600001"):
        r = await client.get(f"/v1/tables/default/changes?{query}")
        assert r.status_code == 422, query
    r = await client.get("/v1/tables/nope/changes")
    assert r.status_code == 404 and r.json()["error"]["code"] == "table_not_found"


def test_the_ring_holds_the_last_events_and_pages_through_batches() -> None:
    feed = ChangeFeed(keep=10)
    for i in range(30):
        feed.put([f"a{i}", f"b{i}"], np.array([1.0, 2.0]), float(i))
    assert feed.seq == 60
    assert 10 <= feed.seq - feed.oldest + 1 <= 12  # whole batches: at most one more
    with pytest.raises(Gone):
        feed.events(feed.oldest - 2, 100)
    got = feed.events(feed.oldest - 1, 100)
    assert [e.seq for e in got] == list(range(feed.oldest, 61))
    page = feed.events(55, 3)
    assert [(e.seq, e.key) for e in page] == [(56, "b27"), (57, "a28"), (58, "b28")]
