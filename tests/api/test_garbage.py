"""Hundreds of malformed requests: each is answered 4xx, and the data pushed before is intact."""

from __future__ import annotations

import random

import httpx
import msgpack

from rlreplay.wire.codec import packb

ROUTES = [
    ("POST", "/v1/tables/default/items"),
    ("POST", "/v1/tables/default/items:batchGet"),
    ("POST", "/v1/tables/default/items:batchDelete"),
    ("POST", "/v1/tables/default/sample"),
    ("POST", "/v1/tables/default/priorities"),
    ("PUT", "/v1/tables/garbage"),
]
CTYPES = [
    "application/json",
    "application/msgpack",
    "application/x-msgpack",
    "text/plain",
    "application/octet-stream",
    "multipart/form-data",
    "",
]


def garbage_bodies(rng: random.Random) -> list[bytes]:
    """Truncated msgpack, wrong types, huge keys, random bytes, deep nesting."""
    good = packb({"items": [{"key": "k", "value": {"a": [1, 2, 3]}, "priority": 1.0}]})
    bodies = [
        b"",
        b"null",
        b"[]",
        b"{}",
        b'"items"',
        b"\xc1",
        b"\xff" * 10,
        good[: len(good) // 2],
        good + b"\x00",
        packb({"items": [{"key": "k" * 600, "value": 1}]}),
        packb({"items": [{"key": "k", "value": 1, "priority": -1}]}),
        packb({"items": [{"key": "k", "value": 1, "priority": float("nan")}]}),
        packb({"items": [{"key": "k", "value": 1, "priority": float("inf")}]}),
        packb({"items": [{"key": None, "value": 1}]}),
        packb({"items": [[1, 2]]}),
        packb({"items": {"key": "k"}}),
        packb({"keys": "k"}),
        packb({"keys": [1, 2]}),
        packb({"keys": [b"x"]}),
        packb({"batch_size": -5}),
        packb({"batch_size": 10**9}),
        packb({"batch_size": True}),
        packb({"priorities": [1, 2]}),
        packb({"priorities": {"k": "x"}}),
        packb({"sampler": {"type": 5}}),
        packb({"max_size": -1}),
        b"[" * 5000 + b"]" * 5000,
        b"\x91" * 5000 + b"\xc0",
        b'{"items": [{"key": "k", "value": {"$ndarray": '
        b'{"dtype": "<f4", "shape": [9], "data": "AA=="}}}]}',
        msgpack.packb({"items": [{"key": "k", "value": msgpack.ExtType(1, b"\x93")}]})[:-1],
    ]
    for _ in range(30):
        bodies.append(rng.randbytes(rng.randrange(1, 300)))
        cut = rng.randrange(1, len(good))
        bodies.append(good[:cut])
        flipped = bytearray(good)
        flipped[rng.randrange(len(good))] ^= 1 << rng.randrange(8)
        bodies.append(bytes(flipped))
    return bodies


async def test_garbage_is_refused_and_data_survives(client: httpx.AsyncClient) -> None:
    items = [{"key": f"keep/{i}", "value": {"i": i}} for i in range(50)]
    r = await client.post("/v1/tables/default/items", json={"items": items, "wait": True})
    assert r.status_code == 200
    rng = random.Random(1234)
    bodies = garbage_bodies(rng)
    statuses: dict[int, int] = {}
    sent = 0
    for body in bodies:
        for _ in range(2):
            method, path = rng.choice(ROUTES)
            ctype = rng.choice(CTYPES)
            headers = {"content-type": ctype} if ctype else {}
            r = await client.request(method, path, content=body, headers=headers)
            sent += 1
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code >= 300:
                assert 400 <= r.status_code < 500, (method, path, ctype, body[:80], r.text)
                assert set(r.json()["error"]) == {"code", "message"}
    assert sent >= 200
    assert statuses.get(400, 0) > 50 and statuses.get(415, 0) > 20, statuses
    r = await client.post(
        "/v1/tables/default/items:batchGet", json={"keys": [i["key"] for i in items]}
    )
    assert [item["value"] for item in r.json()["items"]] == [{"i": i} for i in range(50)]
    assert (await client.get("/readyz")).status_code == 200
