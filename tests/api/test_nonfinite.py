"""NaN and infinities in item values: stored as msgpack floats, spelled ``{"$float": ...}``
over JSON, both ways, and never a reason for a JSON answer to fail."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest

from rlreplay.app.api.encoding import dump_json
from rlreplay.wire.arrays import EXT_NDARRAY, array_payload
from rlreplay.wire.codec import from_jsonable, unpackb
from tests.live import LiveServer

MSGPACK = "application/msgpack"
NAN, INF = math.nan, math.inf
NAN_F, INF_F, NINF_F = {"$float": "NaN"}, {"$float": "Infinity"}, {"$float": "-Infinity"}
#: An array holding NaN: its bits travel as bytes, untouched by the float spelling.
ARRAY = np.array([NAN, INF, -INF, 1.5], dtype="<f4")


def strict_json(content: bytes) -> Any:
    """``json.loads`` refusing the ``NaN``/``Infinity`` literals Python accepts by default."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(content, parse_constant=refuse)


def stored_value(*, single: bool) -> bytes:
    """A value with NaN, +Inf and -Inf at every depth, as float32 or float64 msgpack."""
    value = {
        "r": NAN,
        "obs": [INF, -INF, 0.5],
        "m": {"deep": [{"x": NAN}, [-INF]]},
        "arr": msgpack.ExtType(EXT_NDARRAY, array_payload(ARRAY)),
        "n": 3,
    }
    packed: bytes = msgpack.packb(value, use_single_float=single)
    return packed


#: The JSON form of :func:`stored_value` (0.5 is exact in float32 too).
EXPECTED_FORM = {
    "r": NAN_F,
    "obs": [INF_F, NINF_F, 0.5],
    "m": {"deep": [{"x": NAN_F}, [NINF_F]]},
    "n": 3,
}


def check_form(form: dict[str, Any]) -> None:
    assert {k: v for k, v in form.items() if k != "arr"} == EXPECTED_FORM
    assert form["arr"]["$ndarray"]["dtype"] == "<f4"
    assert from_jsonable(form["arr"]).tobytes() == ARRAY.tobytes()


def check_value(value: dict[str, Any]) -> None:
    assert math.isnan(value["r"]) and value["obs"] == [INF, -INF, 0.5]
    assert math.isnan(value["m"]["deep"][0]["x"]) and value["m"]["deep"][1] == [-INF]
    assert value["arr"].tobytes() == ARRAY.tobytes() and value["n"] == 3


def push_body(items: dict[str, bytes]) -> bytes:
    """``{"items": [{"key", "value"}, ...]}`` in msgpack, each value spliced in as given."""
    assert len(items) < 16
    parts = [b"\x81\xa5items", bytes((0x90 | len(items),))]
    for key, value in items.items():
        parts += [b"\x82\xa3key", msgpack.packb(key), b"\xa5value", value]
    return b"".join(parts)


async def push_raw(client: httpx.AsyncClient, table: str, items: dict[str, bytes]) -> None:
    r = await client.post(
        f"/v1/tables/{table}/items", content=push_body(items), headers={"content-type": MSGPACK}
    )
    assert r.status_code == 202, r.text


@pytest.mark.parametrize("single", [False, True], ids=["float64", "float32"])
async def test_stored_nonfinite_floats_read_back_over_json_and_msgpack(
    client: httpx.AsyncClient, single: bool
) -> None:
    stored = stored_value(single=single)
    await push_raw(client, "default", {"nf": stored})

    r = await client.get("/v1/tables/default/items/nf")
    assert r.status_code == 200, r.text
    check_form(strict_json(r.content)["value"])
    r = await client.post("/v1/tables/default/items:batchGet", json={"keys": ["nf", "none"]})
    assert r.status_code == 200, r.text
    got = strict_json(r.content)["items"]
    assert got[1] is None
    check_form(got[0]["value"])
    r = await client.post("/v1/tables/default/sample", json={"batch_size": 3})
    assert r.status_code == 200, r.text
    for pick in strict_json(r.content)["items"]:
        check_form(pick["value"])

    for r in (
        await client.get("/v1/tables/default/items/nf", headers={"accept": MSGPACK}),
        await client.post(
            "/v1/tables/default/items:batchGet",
            content=msgpack.packb({"keys": ["nf"]}),
            headers={"content-type": MSGPACK, "accept": MSGPACK},
        ),
    ):
        assert r.status_code == 200 and stored in r.content  # spliced as stored
        body = unpackb(r.content)
        check_value(body["value"] if "value" in body else body["items"][0]["value"])
    r = await client.post(
        "/v1/tables/default/sample",
        content=msgpack.packb({"batch_size": 2}),
        headers={"content-type": MSGPACK, "accept": MSGPACK},
    )
    assert r.status_code == 200
    for pick in unpackb(r.content)["items"]:
        check_value(pick["value"])


async def test_float_tags_pushed_over_json_are_stored_as_msgpack_floats(
    client: httpx.AsyncClient,
) -> None:
    value = {
        "r": NAN_F,
        "obs": [INF_F, NINF_F, 0.5],
        "m": {"deep": [{"x": NAN_F}, [NINF_F]]},
        "n": 3,
        "arr": {"$ndarray": {"dtype": "<f4", "shape": [4], "data": "AADAfwAAgH8AAID/AADAPw=="}},
        "lookalike": {"$map": [["$float", "NaN"]]},
    }
    r = await client.post(
        "/v1/tables/default/items", json={"items": [{"key": "js", "value": value}], "wait": True}
    )
    assert r.status_code == 200, r.text

    r = await client.get("/v1/tables/default/items/js", headers={"accept": MSGPACK})
    got = unpackb(r.content)["value"]
    check_value(got)
    assert got["lookalike"] == {"$float": "NaN"}  # a map of strings, as escaped
    assert msgpack.packb(NAN) in r.content and msgpack.packb(-INF) in r.content  # float64

    r = await client.get("/v1/tables/default/items/js")
    form = strict_json(r.content)["value"]
    assert form == value | {"arr": form["arr"]}
    del form["lookalike"]
    check_form(form)


@pytest.mark.parametrize("bad", ["nan", "inf", "1.5", 1.5, None], ids=repr)
async def test_a_malformed_float_tag_is_400(client: httpx.AsyncClient, bad: Any) -> None:
    r = await client.post(
        "/v1/tables/default/items", json={"items": [{"key": "k", "value": {"$float": bad}}]}
    )
    assert r.status_code == 400, r.text
    assert strict_json(r.content)["error"]["code"] == "bad_request"


async def test_a_json_sample_that_retires_items_answers_them_all(
    client: httpx.AsyncClient,
) -> None:
    r = await client.put(
        "/v1/tables/once", json={"sampler": {"type": "uniform"}, "max_times_sampled": 1}
    )
    assert r.status_code == 201, r.text
    keys = [f"k{i}" for i in range(6)]
    await push_raw(client, "once", {k: stored_value(single=i % 2 == 1) for i, k in enumerate(keys)})

    r = await client.post("/v1/tables/once/sample", json={"batch_size": 4})
    assert r.status_code == 200, r.text
    picks = strict_json(r.content)["items"]
    answered = [p["key"] for p in picks]
    assert len(set(answered)) == 4  # max_times_sampled 1: each item at most once
    for pick in picks:
        check_form(pick["value"])

    r = await client.post("/v1/tables/once/items:batchGet", json={"keys": keys})
    left = {k for k, item in zip(keys, strict_json(r.content)["items"], strict=True) if item}
    assert left == set(keys) - set(answered)  # consumed exactly the items answered
    r = await client.post("/v1/tables/once/sample", json={"batch_size": 2})
    assert r.status_code == 200, r.text
    assert {p["key"] for p in strict_json(r.content)["items"]} == left


async def test_a_huge_is_exponent_gives_finite_weights_over_json(
    client: httpx.AsyncClient,
) -> None:
    config = {"sampler": {"type": "prioritized", "exponent": 1.0, "is_exponent": 400.0}}
    assert (await client.put("/v1/tables/beta", json=config)).status_code == 201
    items = [{"key": "big", "value": 1, "priority": 1.0}]
    items += [{"key": f"small{i}", "value": 1, "priority": 1e-6} for i in range(8)]
    r = await client.post("/v1/tables/beta/items", json={"items": items, "wait": True})
    assert r.status_code == 200
    r = await client.post("/v1/tables/beta/sample", json={"batch_size": 64})
    assert r.status_code == 200, r.text
    weights = {p["key"]: p["weight"] for p in strict_json(r.content)["items"]}
    assert all(isinstance(w, float) and 0.0 <= w <= 1.0 for w in weights.values())
    assert max(weights.values()) == 1.0


def test_any_nonfinite_number_in_an_answer_is_spelled_not_refused() -> None:
    answer = {"items": [{"priority": 1.0, "weight": INF, "probability": NAN, "value": [-INF]}]}
    assert strict_json(dump_json(answer)) == {
        "items": [{"priority": 1.0, "weight": INF_F, "probability": NAN_F, "value": [NINF_F]}]
    }
    assert dump_json({"a": [1.5, "NaN"]}) == b'{"a":[1.5,"NaN"]}'


async def test_against_a_real_server(live: LiveServer) -> None:
    """The same over a real socket, with the default hybrid storage and its log."""
    async with httpx.AsyncClient(base_url=live.url) as c:
        config = {"sampler": {"type": "fifo"}, "max_times_sampled": 1}
        assert (await c.put("/v1/tables/nonfinite", json=config)).status_code == 201
        keys = [f"k{i}" for i in range(5)]
        await push_raw(c, "nonfinite", {k: stored_value(single=k == "k1") for k in keys})
        r = await c.post(
            "/v1/tables/nonfinite/items",
            json={"items": [{"key": "js", "value": EXPECTED_FORM}], "wait": True},
        )
        assert r.status_code == 200, r.text

        r = await c.get("/v1/tables/nonfinite/items/k1")
        assert r.status_code == 200, r.text
        check_form(strict_json(r.content)["value"])
        r = await c.post("/v1/tables/nonfinite/items:batchGet", json={"keys": ["js", "k0"]})
        assert r.status_code == 200, r.text
        js, k0 = strict_json(r.content)["items"]
        assert js["value"] == EXPECTED_FORM
        check_form(k0["value"])
        r = await c.get("/v1/tables/nonfinite/items/js", headers={"accept": MSGPACK})
        value = unpackb(r.content)["value"]
        assert math.isnan(value["r"]) and value["m"]["deep"][1] == [-INF]

        r = await c.post("/v1/tables/nonfinite/sample", json={"batch_size": 3})
        assert r.status_code == 200, r.text
        picks = strict_json(r.content)["items"]
        assert [p["key"] for p in picks] == keys[:3]  # fifo: the oldest three, once each
        for pick in picks:
            check_form(pick["value"])
        r = await c.post("/v1/tables/nonfinite/items:batchGet", json={"keys": [*keys, "js"]})
        left = [item["key"] for item in strict_json(r.content)["items"] if item]
        assert left == ["k3", "k4", "js"]
        assert (await c.delete("/v1/tables/nonfinite")).status_code == 204
