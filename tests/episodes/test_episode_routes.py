"""Episode tables over HTTP: appends (idempotent, numbered, ended), reads by range, deletes,
the contract's errors, the stats, and item routes refused on an episode table."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest

from rlreplay.app.main import create_app
from rlreplay.app.settings import Settings
from rlreplay.wire.codec import packb, unpackb

MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client of an in-process app in memory mode with the log on."""
    app = create_app(Settings(data_dir=tmp_path / "data", storage_mode="memory"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            yield c


def ndarray(a: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    data = base64.b64encode(a.tobytes()).decode()
    return {"$ndarray": {"dtype": a.dtype.str, "shape": list(a.shape), "data": data}}


def from_json(form: dict[str, Any]) -> np.ndarray:
    nd = form["$ndarray"]
    raw = base64.b64decode(nd["data"])
    return np.frombuffer(raw, dtype=np.dtype(nd["dtype"])).reshape(nd["shape"])


async def create(client: httpx.AsyncClient, name: str = "eps", **config: Any) -> None:
    body = {"episodes": {"compression": "zstd"}, **config}
    r = await client.put(f"/v1/tables/{name}", json=body)
    assert r.status_code == 201, r.text


async def append(
    client: httpx.AsyncClient, episode: str, body: dict[str, Any], table: str = "eps"
) -> httpx.Response:
    return await client.post(
        f"/v1/tables/{table}/episodes/{episode}/steps", content=packb(body), headers=MSGPACK
    )


def steps(rng: np.random.Generator, k: int, offset: int = 0) -> dict[str, np.ndarray]:
    return {
        "obs": rng.integers(0, 255, size=(k, 8, 8), dtype=np.uint8),
        "action": np.arange(offset, offset + k, dtype=np.int64),
        "reward": rng.random(k).astype(np.float32),
    }


async def read(client: httpx.AsyncClient, episode: str, **params: int) -> dict[str, Any]:
    r = await client.get(f"/v1/tables/eps/episodes/{episode}", params=params, headers=MSGPACK)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = unpackb(r.content)
    return out


async def test_appends_read_back_bit_for_bit(client: httpx.AsyncClient) -> None:
    await create(client)
    rng = np.random.default_rng(1)
    parts = [steps(rng, k, o) for k, o in ((5, 0), (300, 5), (1, 305))]
    start = 0
    for part in parts:
        r = await append(client, "ep-1", {"start": start, "steps": part})
        assert r.status_code == 202 and unpackb(r.content) == {"accepted": len(part["action"])}
        start += len(part["action"])
    final = {"obs": np.full((8, 8), 7, dtype=np.uint8)}
    r = await append(
        client,
        "ep-1",
        {"start": start, "steps": steps(rng, 0), "end": {"reason": "truncated", "final": final},
         "wait": True},
    )  # fmt: skip
    assert r.status_code == 200 and unpackb(r.content) == {"committed": 0}
    whole = {f: np.concatenate([p[f] for p in parts]) for f in parts[0]}
    got = await read(client, "ep-1")
    assert got["length"] == 306 and got["end"] == "truncated"
    for f, a in whole.items():
        assert got["steps"][f].dtype == a.dtype
        np.testing.assert_array_equal(got["steps"][f], a)
    np.testing.assert_array_equal(got["final"]["obs"], final["obs"])
    part = await read(client, "ep-1", start=3, stop=70)
    np.testing.assert_array_equal(part["steps"]["obs"], whole["obs"][3:70])
    # JSON answers carry the same arrays in the contract's $ndarray form
    r = await client.get("/v1/tables/eps/episodes/ep-1", params={"start": 300})
    np.testing.assert_array_equal(from_json(r.json()["steps"]["obs"]), whole["obs"][300:])
    stats = (await client.get("/v1/tables/eps")).json()["stats"]
    assert stats["episodes"] == 1 and stats["steps"] == 306 and stats["size"] == 306
    assert 0 < stats["stored_bytes"]


async def test_json_appends(client: httpx.AsyncClient) -> None:
    await create(client)
    obs = np.arange(12, dtype=np.float32).reshape(3, 4)
    body = {"start": 0, "steps": {"obs": ndarray(obs), "reward": [1.0, 0.5, 0.0]},
            "priorities": [1.0, 2.0, 3.0]}  # fmt: skip
    r = await client.post("/v1/tables/eps/episodes/e/steps", json=body)
    assert r.status_code == 202, r.text
    got = (await client.get("/v1/tables/eps/episodes/e")).json()
    np.testing.assert_array_equal(from_json(got["steps"]["obs"]), obs)
    np.testing.assert_array_equal(from_json(got["steps"]["reward"]), [1.0, 0.5, 0.0])


async def test_retry_changes_nothing_and_conflicts_answer_409(client: httpx.AsyncClient) -> None:
    await create(client)
    rng = np.random.default_rng(2)
    first = steps(rng, 10)
    assert (await append(client, "ep", {"start": 0, "steps": first})).status_code == 202
    # the same steps again: accepted, nothing changes
    r = await append(client, "ep", {"start": 0, "steps": first})
    assert r.status_code == 202 and unpackb(r.content) == {"accepted": 10}
    assert (await read(client, "ep"))["length"] == 10
    # other bytes at a stored start, or a gap: 409 naming the length
    other = steps(rng, 10)
    for body in ({"start": 0, "steps": other}, {"start": 12, "steps": other}):
        r = await append(client, "ep", body)
        assert r.status_code == 409, r.text
        error = unpackb(r.content)["error"]
        assert error["code"] == "step_conflict" and "10" in error["message"]
    assert (await read(client, "ep"))["length"] == 10
    # ended: appending again is a conflict, the same end again a retry
    end = {"start": 10, "steps": steps(rng, 2), "end": {"reason": "terminated"}}
    assert (await append(client, "ep", end)).status_code == 202
    assert (await append(client, "ep", end)).status_code == 202
    r = await append(client, "ep", {"start": 12, "steps": steps(rng, 1)})
    assert r.status_code == 409 and unpackb(r.content)["error"]["code"] == "step_conflict"
    got = await read(client, "ep")
    assert got["length"] == 12 and got["end"] == "terminated"


async def test_request_id_is_served_once(client: httpx.AsyncClient) -> None:
    await create(client)
    rng = np.random.default_rng(3)
    body = {"start": 0, "steps": steps(rng, 4), "request_id": "r-1"}
    assert (await append(client, "ep", body)).status_code == 202
    assert (await append(client, "ep", {"start": 4, "steps": steps(rng, 4)})).status_code == 202
    # the first request again, though its start is now stale: the first answer
    r = await append(client, "ep", body)
    assert r.status_code == 202 and unpackb(r.content) == {"accepted": 4}
    assert (await read(client, "ep"))["length"] == 8


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda s: {**s, "obs": s["obs"].astype(np.int16)}, "obs"),
        (lambda s: {**s, "obs": s["obs"][:, :4]}, "obs"),
        (lambda s: {k: v for k, v in s.items() if k != "reward"}, "reward"),
        (lambda s: {**s, "extra": s["reward"]}, "extra"),
    ],
)
async def test_field_changes_are_refused_naming_the_field(
    client: httpx.AsyncClient, mutate: Any, words: str
) -> None:
    await create(client)
    rng = np.random.default_rng(4)
    assert (await append(client, "a", {"start": 0, "steps": steps(rng, 3)})).status_code == 202
    r = await append(client, "b", {"start": 0, "steps": mutate(steps(rng, 3))})
    assert r.status_code == 422, r.text
    error = unpackb(r.content)["error"]
    assert error["code"] == "validation_error" and words in error["message"]
    r = await client.get("/v1/tables/eps/episodes/b")
    assert r.status_code == 404 and r.json()["error"]["code"] == "item_not_found"


async def test_bad_priorities_and_names(client: httpx.AsyncClient) -> None:
    await create(client)
    rng = np.random.default_rng(5)
    r = await append(client, "a", {"start": 0, "steps": steps(rng, 3), "priorities": [1.0]})
    assert r.status_code == 422 and "priorities" in unpackb(r.content)["error"]["message"]
    r = await append(client, "x" * 513, {"start": 0, "steps": steps(rng, 3)})
    assert r.status_code == 422
    r = await append(client, "a", {"start": 0, "steps": steps(rng, 3), "end": {"reason": "x"}})
    assert r.status_code == 422
    r = await client.post(
        "/v1/tables/eps/episodes/a/steps",
        content=msgpack.packb({"start": 0, "steps": [1, 2]}),
        headers=MSGPACK,
    )
    assert r.status_code in (400, 422)
    assert (await client.get("/v1/tables/eps/episodes/a")).status_code == 404


async def test_delete(client: httpx.AsyncClient) -> None:
    await create(client)
    rng = np.random.default_rng(6)
    assert (await append(client, "a", {"start": 0, "steps": steps(rng, 3)})).status_code == 202
    r = await client.delete("/v1/tables/eps/episodes/a")
    assert r.status_code == 202
    assert (await client.get("/v1/tables/eps/episodes/a")).status_code == 404
    # a new episode of the same name starts at 0 again
    body = {"start": 0, "steps": steps(rng, 2), "wait": True}
    assert (await append(client, "a", body)).status_code == 200
    stats = (await client.get("/v1/tables/eps")).json()["stats"]
    assert stats["steps"] == 2 and stats["episodes"] == 1


async def test_max_size_removes_whole_episodes_oldest_first(client: httpx.AsyncClient) -> None:
    await create(client, max_size=25)
    rng = np.random.default_rng(7)
    for i in range(4):
        body = {"start": 0, "steps": steps(rng, 10), "end": {"reason": "terminated"}, "wait": True}
        assert (await append(client, f"e{i}", body)).status_code == 200
    stats = (await client.get("/v1/tables/eps")).json()["stats"]
    assert stats["steps"] == 20 and stats["episodes"] == 2
    assert (await client.get("/v1/tables/eps/episodes/e0")).status_code == 404
    assert (await client.get("/v1/tables/eps/episodes/e3")).status_code == 200


async def test_item_routes_refuse_episode_tables(client: httpx.AsyncClient) -> None:
    await create(client)
    r = await client.post("/v1/tables/eps/items", json={"items": [{"key": "k", "value": 1}]})
    assert r.status_code == 422 and "episodes" in r.json()["error"]["message"]
    r = await client.get("/v1/tables/eps/items/k")
    assert r.status_code == 422
    r = await client.post("/v1/tables/eps/items:batchGet", json={"keys": ["k"]})
    assert r.status_code == 422
    # and episode routes refuse tables of items
    rng = np.random.default_rng(8)
    r = await append(client, "a", {"start": 0, "steps": steps(rng, 1)}, table="default")
    assert r.status_code == 422
