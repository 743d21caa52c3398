"""A second probe of the contract's "Rollout tables at scale", sentence by sentence, over
HTTP: a live ``rlreplay serve`` spoken to in msgpack for the waits and expiries, the
in-process app in JSON for the edge cases; exact answer shapes and error codes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest

from tests.rollouts.inproc import claim, create, push, serving

MSGPACK = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}


async def _mp(c: httpx.AsyncClient, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """A msgpack request and its decoded msgpack answer."""
    content = None if body is None else msgpack.packb(body)
    r = await c.request(method, path, content=content, headers=MSGPACK)
    if not r.content:
        return r.status_code, None
    assert r.headers["content-type"].startswith("application/msgpack"), r.headers
    return r.status_code, msgpack.unpackb(r.content)


def _error(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.json() == {"error": {"code": code, "message": r.json()["error"]["message"]}}
    assert isinstance(r.json()["error"]["message"], str)


async def _tasks(c: httpx.AsyncClient, table: str = "t") -> dict[str, Any]:
    r = await c.get(f"/v1/tables/{table}/tasks")
    assert r.status_code == 200, r.text
    return dict(r.json())


# -- tags ------------------------------------------------------------------------------


async def test_tag_values_of_each_kind_round_trip_and_the_limits(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        tags = {"s": "x", "i": -3, "f": 0.5, "b": True}
        await push(c, "t", [{"key": "k", "value": {"a": 1}, "tags": tags}])
        got = (await c.get("/v1/tables/t/items/k")).json()
        assert got["tags"] == tags and type(got["tags"]["b"]) is bool
        sixteen = {f"t{i}": i for i in range(16)}
        await push(c, "t", [{"key": "k16", "value": 1, "tags": sixteen}])
        assert (await c.get("/v1/tables/t/items/k16")).json()["tags"] == sixteen
        for bad in (
            {f"t{i}": i for i in range(17)},
            {"a": [1]},
            {"a": {"b": 1}},
            {"a": None},
            {"": 1},
            {"a" * 129: 1},
        ):
            r = await c.post(
                "/v1/tables/t/items", json={"items": [{"key": "bad", "value": 1, "tags": bad}]}
            )
            _error(r, 422, "validation_error")
        assert (await c.get("/v1/tables/t/items/bad")).status_code == 404
        # a patch that would pass 16 after the merge is refused, and changes nothing
        r = await c.post(
            "/v1/tables/t/items:patch",
            json={"items": [{"key": "k16", "tags": {"extra": 1}}], "wait": True},
        )
        _error(r, 422, "validation_error")
        r = await c.post(
            "/v1/tables/t/items:patch",
            json={"items": [{"key": "k", "tags": {"a": [1]}}], "wait": True},
        )
        _error(r, 422, "validation_error")
        assert (await c.get("/v1/tables/t/items/k16")).json()["tags"] == sixteen
        # a patch replacing one tag's value: the filter sees the new value only
        r = await c.post(
            "/v1/tables/t/items:patch",
            json={"items": [{"key": "k", "tags": {"s": "y"}}], "wait": True},
        )
        assert r.json() == {"committed": 1, "missing": 0}
        old = await claim(c, "t", task="a", batch_size=5, where={"s": "x"}, wait_ms=0, partial=True)
        assert old["items"] == [] and old["lease"] == ""
        new = await claim(c, "t", task="a", batch_size=5, where={"s": "y"}, wait_ms=0, partial=True)
        assert [it["key"] for it in new["items"]] == ["k"]
        assert new["items"][0]["tags"] == {**tags, "s": "y"}


async def test_items_without_tags_have_no_tags_field(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(c, "t", [{"key": "k", "value": {"a": 1}}])
        assert "tags" not in (await c.get("/v1/tables/t/items/k")).json()
        got = await claim(c, "t", task="a", batch_size=1)
        assert "tags" not in got["items"][0]


# -- where -----------------------------------------------------------------------------


def _tagged(n: int) -> list[dict[str, Any]]:
    return [
        {
            "key": f"r{i:02d}",
            "value": {"tokens": [1] * (i + 1)},
            "group": f"g{i // 2}",
            "version": i // 4,
            "tags": {"ds": ["math", "code", "chat"][i % 3], "level": i, "name": f"n{i:02d}"},
        }
        for i in range(n)
    ]


async def test_where_edge_cases(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(c, "t", _tagged(12))
        tasks = iter(range(1000))

        async def keys(where: Any) -> list[str]:
            got = await claim(
                c, "t", task=f"x{next(tasks)}", batch_size=12, where=where, wait_ms=0, partial=True
            )
            return [it["key"] for it in got["items"]]

        assert await keys({"unknown": "x"}) == []
        assert await keys({"unknown": {"gte": 0}}) == []
        assert await keys({"level": {"in": []}}) == []
        assert await keys({}) == [f"r{i:02d}" for i in range(12)]  # no condition: every item
        assert await keys({"level": 3.0}) == ["r03"]  # 3 equals 3.0
        assert await keys({"level": {"in": [1, 2.0, "3", True]}}) == ["r01", "r02"]
        # a range holds numbers with numeric bounds and strings with string bounds
        assert await keys({"name": {"gte": "n03", "lt": "n05"}}) == ["r03", "r04"]
        assert await keys({"name": {"gte": 0}}) == []
        assert await keys({"level": {"gte": "a"}}) == []
        assert await keys({"level": {"gt": 9.5}}) == ["r10", "r11"]
        assert await keys({"level": {"lte": 1}}) == ["r00", "r01"]
        assert await keys({"ds": {"in": ["math", "chat"]}, "level": {"lt": 6}}) == [
            "r00",
            "r02",
            "r03",
            "r05",
        ]


@pytest.mark.parametrize(
    "where",
    [
        {"x": {"in": 3}},
        {"x": {"in": [1], "gte": 0}},
        {"x": {"in": [[1]]}},
        {"x": {"gte": 1, "gt": 0}},
        {"x": {"lte": 1, "lt": 2}},
        {"x": {"gte": 1, "lte": "b"}},
        {"x": {"gte": True}},
        {"x": {"gte": None}},
        {"x": {}},
        {"x": None},
        {"x": [1]},
        [{"x": 1}],
        "x",
    ],
)
async def test_bad_where_is_422_on_claim_and_sample(tmp_path: Path, where: Any) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        body = {"task": "a", "batch_size": 1, "where": where, "wait_ms": 0}
        r = await c.post("/v1/tables/t/claim", json=body)
        assert r.status_code in (400, 422), r.text
        _error(r, r.status_code, "validation_error" if r.status_code == 422 else "bad_request")
        r = await c.post(
            "/v1/tables/t/sample", json={"batch_size": 1, "where": where, "timeout_ms": 0}
        )
        assert r.status_code in (400, 422), r.text


async def test_where_with_groups_and_min_version_never_splits_a_group(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        items = [
            {
                "key": f"r{i}",
                "value": {"x": i},
                "group": f"g{i // 3}",
                "version": i // 3,
                "tags": {"ds": "math" if i != 4 else "code"},
            }
            for i in range(12)
        ]
        await push(c, "t", items)
        got = await claim(
            c,
            "t",
            task="a",
            batch_size=6,
            group_size=3,
            where={"ds": "math"},
            min_version=1,
            wait_ms=0,
            partial=True,
        )
        # g0 is too old, g1 lacks r4 (not math): g2 and g3 are handed out whole
        assert [it["key"] for it in got["items"]] == ["r6", "r7", "r8", "r9", "r10", "r11"]
        assert {it["group"] for it in got["items"]} == {"g2", "g3"}
        assert all(it["version"] >= 1 for it in got["items"])
        # a patch that makes r4 match completes g1
        await c.post(
            "/v1/tables/t/items:patch",
            json={"items": [{"key": "r4", "tags": {"ds": "math"}}], "wait": True},
        )
        got = await claim(
            c, "t", task="a", batch_size=3, group_size=3, where={"ds": "math"}, min_version=1
        )
        assert [it["key"] for it in got["items"]] == ["r3", "r4", "r5"]


async def test_sample_where_answer_shape_and_stale_items(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        r = await c.put("/v1/tables/t", json={"sampler": {"type": "uniform"}, "max_staleness": 0})
        assert r.status_code == 201
        await push(c, "t", _tagged(8))
        r = await c.put("/v1/tables/t/version", json={"version": 1})
        assert r.status_code == 200
        r = await c.post("/v1/tables/t/sample", json={"batch_size": 32, "where": {"ds": "math"}})
        assert r.status_code == 200, r.text
        picks = r.json()["items"]
        # versions 0 are stale (dropped): of the math items r00, r03, r06 only r06 stays
        assert {p["key"] for p in picks} == {"r06"}
        p = picks[0]
        assert p["tags"]["ds"] == "math" and p["group"] == "g3" and p["version"] == 1
        for name in ("key", "value", "priority", "probability", "weight", "times_sampled"):
            assert name in p
        assert p["probability"] == pytest.approx(1.0)


# -- select and values: false ----------------------------------------------------------


async def test_select_of_an_absent_field_and_values_false(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(
            c,
            "t",
            [
                {"key": "a", "value": {"p": "abc", "t": [1, 2]}, "tags": {"k": 1}},
                {"key": "b", "value": {"p": "de"}},
            ],
        )
        got = await claim(c, "t", task="x", batch_size=2, select=["t", "nope"])
        assert [it["value"] for it in got["items"]] == [{"t": [1, 2]}, {}]
        got = await claim(c, "t", task="y", batch_size=2, values=False, select=["t", "nope"])
        assert [it["lengths"] for it in got["items"]] == [{"t": 2, "nope": 0}, {"t": 0, "nope": 0}]
        assert all("value" not in it for it in got["items"])
        assert got["items"][0]["tags"] == {"k": 1} and "tags" not in got["items"][1]
        # fields must be present; select returns others
        got = await claim(
            c, "t", task="z", batch_size=2, fields=["t"], select=["p"], partial=True, wait_ms=0
        )
        assert [(it["key"], it["value"]) for it in got["items"]] == [("a", {"p": "abc"})]
        # values: false without select nor fields: every field's length
        got = await claim(c, "t", task="w", batch_size=2, values=False)
        assert [it["lengths"] for it in got["items"]] == [{"p": 3, "t": 2}, {"p": 2}]
        # values: false with fields: the fields' lengths
        got = await claim(c, "t", task="v", batch_size=1, values=False, fields=["t"])
        assert got["items"][0]["lengths"] == {"t": 2}


async def test_lengths_of_each_kind_of_value(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        value = {
            "s": "héllo",
            "b": {"$bytes": "AAECAw=="},
            "l": [1, [2, 3]],
            "m": {"a": 1, "b": 2},
            "n": 7,
            "z": None,
            "a": {"$ndarray": {"dtype": "<i4", "shape": [3, 2], "data": "A" * 32}},
        }
        await push(c, "t", [{"key": "k", "value": value}])
        got = await claim(c, "t", task="x", batch_size=1, values=False)
        assert got["items"][0]["lengths"] == {
            "s": 5,
            "b": 4,
            "l": 2,
            "m": 2,
            "n": 1,
            "z": 0,
            "a": 3,
        }


# -- token budgets and ranks -----------------------------------------------------------


async def test_max_tokens_needs_length_field_and_bounds(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        for body in (
            {"max_tokens": 10},
            {"max_tokens": 0, "length_field": "t"},
            {"max_tokens": -1, "length_field": "t"},
            {"world_size": 0},
            {"batch_size": 3, "group_size": 2},
        ):
            r = await c.post(
                "/v1/tables/t/claim", json={"task": "a", "batch_size": 4, "wait_ms": 0, **body}
            )
            _error(r, 422, "validation_error")


async def test_a_budget_with_partial_and_a_scalar_length_field(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(c, "t", [{"key": f"k{i}", "value": {"n": i, "t": "ab"}} for i in range(5)])
        # a scalar counts 1: five items of length 1 within a budget of 3
        got = await claim(c, "t", task="a", batch_size=10, max_tokens=3, length_field="n")
        assert [it["key"] for it in got["items"]] == ["k0", "k1", "k2"]
        # an absent field counts 0: every item fits (up to batch_size)
        got = await claim(c, "t", task="b", batch_size=4, max_tokens=1, length_field="gone")
        assert len(got["items"]) == 4
        # with partial and too little ready: what fits, no 504
        got = await claim(
            c,
            "t",
            task="c",
            batch_size=10,
            max_tokens=100,
            length_field="t",
            wait_ms=0,
            partial=True,
        )
        assert len(got["items"]) == 5
        r = await c.post(
            "/v1/tables/t/claim",
            json={
                "task": "d",
                "batch_size": 10,
                "max_tokens": 100,
                "length_field": "t",
                "wait_ms": 0,
            },
        )
        _error(r, 504, "deadline_exceeded")


async def test_ranks_world_size_past_the_groups_and_without_length_field(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        sizes = [4, 4, 1, 1, 9, 9]
        await push(
            c,
            "t",
            [
                {"key": f"r{i}", "value": {"t": [0] * n}, "group": f"g{i // 2}"}
                for i, n in enumerate(sizes)
            ],
        )
        got = await claim(
            c, "t", task="a", batch_size=6, group_size=2, world_size=5, length_field="t"
        )
        ranks = got["ranks"]
        assert len(ranks) == 5 and sum(map(len, ranks)) == 6
        assert sorted(i for rank in ranks for i in rank) == list(range(6))
        for rank in ranks:
            assert rank == sorted(rank)
            assert len({got["items"][i]["group"] for i in rank}) <= 1  # one group per rank
        assert sum(1 for rank in ranks if not rank) == 2
        # without length_field each item counts 1; items without a group split one by one
        await push(c, "t", [{"key": f"u{i}", "value": {"t": [0] * (i + 1)}} for i in range(4)])
        got = await claim(c, "t", task="b", batch_size=4, world_size=2)
        # first four are r0..r3 (oldest first), whose groups g0, g1 go whole to one rank each
        assert sorted(map(len, got["ranks"])) == [2, 2]
        got = await claim(c, "t", task="a", batch_size=4, world_size=4)
        assert [it["key"] for it in got["items"]] == ["u0", "u1", "u2", "u3"]
        assert sorted(map(len, got["ranks"])) == [1, 1, 1, 1]
        # without world_size there is no ranks field
        got = await claim(c, "t", task="c", batch_size=1)
        assert "ranks" not in got


# -- reservations ----------------------------------------------------------------------


async def test_reservation_bodies_are_checked(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t", admission={"max_ahead": 4})
        for body in (
            {"count": 0, "version": 0},
            {"count": -1, "version": 0},
            {"count": 2**31, "version": 0},
            {"count": 1, "version": -1},
            {"count": 1, "version": 0, "wait_ms": -1},
            {"count": 1, "version": 0, "ttl_s": 0},
            {"count": 1, "version": 0, "ttl_s": 86_401},
        ):
            r = await c.post("/v1/tables/t/reservations", json=body)
            _error(r, 422, "validation_error")
        r = await c.post("/v1/tables/t/reservations", json={"version": 0})
        assert r.status_code in (400, 422), r.text
        r = await c.put("/v1/tables/u", json={"admission": {"max_ahead": 0}})
        _error(r, 422, "validation_error")
        r = await c.delete("/v1/tables/t/reservations/never")
        _error(r, 404, "lease_not_found")
        r = await c.delete("/v1/tables/nope/reservations/x")
        _error(r, 404, "table_not_found")


async def test_wait_ms_0_a_push_past_its_slots_and_tasks(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t", admission={"max_ahead": 3}, delete_after_ack=["trainer"])
        r = await c.post("/v1/tables/t/reservations", json={"count": 5, "version": 0, "wait_ms": 0})
        assert r.status_code == 201, r.text
        body = r.json()
        assert set(body) == {"reservation", "granted", "expires_at"}
        assert isinstance(body["reservation"], str) and body["granted"] == 3
        assert isinstance(body["expires_at"], float | int)
        assert body["expires_at"] == pytest.approx(time.time() + 600, abs=30)
        r = await c.post("/v1/tables/t/reservations", json={"count": 1, "version": 0, "wait_ms": 0})
        _error(r, 504, "deadline_exceeded")
        assert (await _tasks(c))["reserved"] == 3
        # five items fill the three slots and are all kept; the reservation is done
        await push(
            c,
            "t",
            [{"key": f"k{i}", "value": {"x": i}} for i in range(5)],
            reservation=body["reservation"],
        )
        assert (await c.get("/v1/tables/t")).json()["stats"]["size"] == 5
        tasks = await _tasks(c)
        assert tasks["reserved"] == 0 and tasks["version"] == 0 and tasks["dropped_stale"] == 0
        r = await c.delete(f"/v1/tables/t/reservations/{body['reservation']}")
        _error(r, 404, "lease_not_found")
        # five held, past max_ahead: nothing granted until the trainer consumes three
        r = await c.post("/v1/tables/t/reservations", json={"count": 1, "version": 0, "wait_ms": 0})
        _error(r, 504, "deadline_exceeded")
        lease = await claim(c, "t", task="trainer", batch_size=3)
        await c.post(f"/v1/tables/t/leases/{lease['lease']}:ack")
        r = await c.post("/v1/tables/t/reservations", json={"count": 4, "version": 0, "wait_ms": 0})
        assert r.status_code == 201 and r.json()["granted"] == 1, r.text
        # leased items still count until acknowledged
        tasks = await _tasks(c)
        assert tasks["tasks"]["trainer"] == {"ready": 2, "leased": 0, "acked": 3, "expired": 0}


async def test_a_table_without_admission_grants_all_and_counts_reserved(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        r = await c.post("/v1/tables/t/reservations", json={"count": 7, "version": 0, "wait_ms": 0})
        assert r.status_code == 201 and r.json()["granted"] == 7
        assert (await _tasks(c))["reserved"] == 7
        rid = r.json()["reservation"]
        r = await c.delete(f"/v1/tables/t/reservations/{rid}")
        assert r.status_code == 200 and r.json() == {"returned": 7}
        assert (await _tasks(c))["reserved"] == 0


# -- live server, msgpack: waits without polling, expiry ------------------------------


async def test_live_msgpack_reservation_waits_fills_and_expires(server_url: str) -> None:
    async with httpx.AsyncClient(base_url=server_url, timeout=60) as c:
        status, _ = await _mp(
            c,
            "PUT",
            "/v1/tables/mp_res",
            {
                "sampler": {"type": "fifo"},
                "admission": {"max_ahead": 2},
                "delete_after_ack": ["tr"],
            },
        )
        assert status == 201
        status, first = await _mp(
            c, "POST", "/v1/tables/mp_res/reservations", {"count": 2, "version": 0, "ttl_s": 0.4}
        )
        assert status == 201 and first["granted"] == 2 and isinstance(first["expires_at"], float)
        started = time.monotonic()
        status, second = await _mp(
            c,
            "POST",
            "/v1/tables/mp_res/reservations",
            {"count": 2, "version": 0, "wait_ms": 30_000},
        )
        # woken by the first's expiry (0.4 s), long before wait_ms
        assert status == 201 and second["granted"] == 2, second
        assert time.monotonic() - started < 25
        status, err = await _mp(
            c, "DELETE", f"/v1/tables/mp_res/reservations/{first['reservation']}"
        )
        assert status == 404 and err["error"]["code"] == "lease_not_found"
        status, answer = await _mp(
            c,
            "POST",
            "/v1/tables/mp_res/items",
            {
                "items": [
                    {"key": "a", "value": {"t": [1, 2]}, "tags": {"d": "m"}, "group": "g"},
                    {"key": "b", "value": {"t": [3]}, "tags": {"d": "m"}, "group": "g"},
                ],
                "reservation": second["reservation"],
                "wait": True,
            },
        )
        assert status == 200 and answer == {"committed": 2}
        status, tasks = await _mp(c, "GET", "/v1/tables/mp_res/tasks")
        assert status == 200 and tasks["reserved"] == 0
        # a third waits until the trainer consumes: a claim and an ack wake it
        waiting = asyncio.create_task(
            _mp(
                c,
                "POST",
                "/v1/tables/mp_res/reservations",
                {"count": 1, "version": 0, "wait_ms": 30_000},
            )
        )
        await asyncio.sleep(0.3)
        assert not waiting.done()
        status, lease = await _mp(
            c,
            "POST",
            "/v1/tables/mp_res/claim",
            {
                "task": "tr",
                "batch_size": 2,
                "group_size": 2,
                "where": {"d": "m"},
                "world_size": 2,
                "max_tokens": 10,
                "length_field": "t",
                "values": False,
                "select": ["t"],
            },
        )
        assert status == 200, lease
        assert [it["lengths"] for it in lease["items"]] == [{"t": 2}, {"t": 1}]
        assert lease["ranks"] in ([[0, 1], []], [[], [0, 1]])
        assert lease["items"][0]["tags"] == {"d": "m"} and lease["items"][0]["group"] == "g"
        status, acked = await _mp(c, "POST", f"/v1/tables/mp_res/leases/{lease['lease']}:ack", {})
        assert status == 200 and acked == {"acked": 2}
        status, third = await asyncio.wait_for(waiting, 20)
        assert status == 201 and third["granted"] == 1


async def test_live_msgpack_claim_with_where_wakes_on_a_patch(server_url: str) -> None:
    async with httpx.AsyncClient(base_url=server_url, timeout=60) as c:
        status, _ = await _mp(c, "PUT", "/v1/tables/mp_where", {"sampler": {"type": "fifo"}})
        assert status == 201
        await _mp(
            c,
            "POST",
            "/v1/tables/mp_where/items",
            {"items": [{"key": "a", "value": {"x": 1}, "tags": {"ok": False}}], "wait": True},
        )
        waiting = asyncio.create_task(
            _mp(
                c,
                "POST",
                "/v1/tables/mp_where/claim",
                {"task": "t", "batch_size": 1, "where": {"ok": True}, "wait_ms": 30_000},
            )
        )
        await asyncio.sleep(0.3)
        assert not waiting.done()
        status, _ = await _mp(
            c,
            "POST",
            "/v1/tables/mp_where/items:patch",
            {"items": [{"key": "a", "tags": {"ok": True}}]},
        )
        assert status == 202
        status, got = await asyncio.wait_for(waiting, 20)
        assert status == 200 and [it["key"] for it in got["items"]] == ["a"]
        assert got["items"][0]["tags"] == {"ok": True}
        # sample with where waits for a match too
        waiting = asyncio.create_task(
            _mp(
                c,
                "POST",
                "/v1/tables/mp_where/sample",
                {"batch_size": 1, "where": {"n": {"gte": 5}}, "timeout_ms": 30_000},
            )
        )
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await _mp(
            c,
            "POST",
            "/v1/tables/mp_where/items",
            {"items": [{"key": "b", "value": 2, "tags": {"n": 7}}]},
        )
        status, got = await asyncio.wait_for(waiting, 20)
        assert status == 200 and [p["key"] for p in got["items"]] == ["b"]


async def test_live_ttl_expires_whole_groups_and_tasks_show_it(server_url: str) -> None:
    async with httpx.AsyncClient(base_url=server_url, timeout=60) as c:
        status, _ = await _mp(
            c,
            "PUT",
            "/v1/tables/mp_ttl",
            {"sampler": {"type": "fifo"}, "ttl_s": 0.6, "delete_after_ack": ["a", "b"]},
        )
        assert status == 201
        items = [{"key": f"r{i}", "value": {"x": i}, "group": "g"} for i in range(3)]
        await _mp(c, "POST", "/v1/tables/mp_ttl/items", {"items": items, "wait": True})
        # r0 is acknowledged by every task (so deleted); the other two expire, as a group
        for task in ("a", "b"):
            status, lease = await _mp(
                c, "POST", "/v1/tables/mp_ttl/claim", {"task": task, "batch_size": 1}
            )
            assert [it["key"] for it in lease["items"]] == ["r0"]
            await _mp(c, "POST", f"/v1/tables/mp_ttl/leases/{lease['lease']}:ack", {})
        end = time.monotonic() + 30
        while time.monotonic() < end:
            status, info = await _mp(c, "GET", "/v1/tables/mp_ttl")
            if info["stats"]["expired"] >= 2:
                break
            await asyncio.sleep(0.05)
        assert info["stats"]["expired"] == 2 and info["stats"]["size"] == 0
        status, tasks = await _mp(c, "GET", "/v1/tables/mp_ttl/tasks")
        assert tasks["tasks"]["a"]["ready"] == 0 and tasks["tasks"]["a"]["acked"] == 1
        assert tasks["tasks"]["a"]["leased"] == 0
        assert tasks["reserved"] == 0


async def test_a_rare_filter_walks_its_matches_oldest_first(tmp_path: Path) -> None:
    """Few matches among many items: the claim walks the index's matches in insertion
    order (kept between claims), past acknowledged ones, with releases, replacements and
    patched tags seen."""
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(
            c,
            "t",
            [
                {"key": f"k{i}", "value": {"x": i}, "tags": {"ds": "m" if i % 10 == 0 else "c"}}
                for i in range(100)
            ],
        )

        async def keys(task: str, n: int, **body: Any) -> tuple[str, list[str]]:
            got = await claim(
                c, "t", task=task, batch_size=n, where={"ds": "m"}, wait_ms=0, partial=True, **body
            )
            return got["lease"], [it["key"] for it in got["items"]]

        lease, got = await keys("a", 3)
        assert got == ["k0", "k10", "k20"]
        await c.post(f"/v1/tables/t/leases/{lease}:ack")
        lease, got = await keys("a", 3)
        assert got == ["k30", "k40", "k50"]
        r = await c.post(f"/v1/tables/t/leases/{lease}:release")
        assert r.json() == {"released": 3}
        lease, got = await keys("a", 3)
        assert got == ["k30", "k40", "k50"]
        await c.post(f"/v1/tables/t/leases/{lease}:ack")
        # k0 pushed again is a new rollout, the newest; k5 patched into the filter
        await push(c, "t", [{"key": "k0", "value": {"x": 0}, "tags": {"ds": "m"}}])
        r = await c.post(
            "/v1/tables/t/items:patch",
            json={"items": [{"key": "k5", "tags": {"ds": "m"}}], "wait": True},
        )
        assert r.status_code == 200
        lease, got = await keys("a", 10)
        assert got == ["k5", "k60", "k70", "k80", "k90", "k0"]
        await c.post(f"/v1/tables/t/leases/{lease}:ack")
        assert (await keys("a", 10))[1] == []
        _, got = await keys("b", 20)
        assert got == ["k5", *(f"k{i}" for i in range(10, 100, 10)), "k0"]
        # a deleted match is gone from the walk
        r = await c.post("/v1/tables/t/items:batchDelete", json={"keys": ["k20", "k5"]})
        assert r.status_code == 202
        _, got = await keys("c", 20)
        assert got == [f"k{i}" for i in range(10, 100, 10) if i != 20] + ["k0"]


# -- columnar pushes --------------------------------------------------------------------


async def test_a_columnar_push_carries_tags_groups_versions_and_a_reservation(
    tmp_path: Path,
) -> None:
    import base64

    data = base64.b64encode(bytes(range(4))).decode()
    body = {
        "keys": ["a", "b"],
        "columns": {"t": {"$ndarray": {"dtype": "|u1", "shape": [2, 2], "data": data}}},
        "tags": [{"ds": "math"}, None],
        "groups": ["g", "g"],
        "versions": [3, None],
        "wait": True,
    }
    async with serving(tmp_path) as c:
        await create(c, "t", admission={"max_ahead": 5})
        rid = (await c.post("/v1/tables/t/reservations", json={"count": 3, "version": 0})).json()
        r = await c.post("/v1/tables/t/items", json={**body, "reservation": rid["reservation"]})
        assert r.status_code == 200 and r.json() == {"committed": 2}, r.text
        assert (await _tasks(c))["reserved"] == 1
        a = (await c.get("/v1/tables/t/items/a")).json()
        assert a["tags"] == {"ds": "math"} and a["group"] == "g" and a["version"] == 3
        b = (await c.get("/v1/tables/t/items/b")).json()
        assert "tags" not in b and b["group"] == "g" and "version" not in b
        for bad in ({"tags": [{"ds": 1}]}, {"groups": ["g"] * 3}, {"tags": [{"x": [1]}, None]}):
            r = await c.post("/v1/tables/t/items", json={**body, **bad})
            _error(r, 422, "validation_error")
    async with serving(tmp_path) as c:  # replayed from the log
        a = (await c.get("/v1/tables/t/items/a")).json()
        assert a["tags"] == {"ds": "math"} and a["group"] == "g" and a["version"] == 3
        got = await claim(
            c, "t", task="x", batch_size=2, where={"ds": "math"}, partial=True, wait_ms=0
        )
        assert [it["key"] for it in got["items"]] == ["a"]


async def test_a_msgpack_push_of_items_and_a_reservation_alone(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t", admission={"max_ahead": 4})
        status, got = await _mp(c, "POST", "/v1/tables/t/reservations", {"count": 2, "version": 0})
        assert status == 201
        body = {"items": [{"key": "a", "value": 1}], "reservation": got["reservation"]}
        status, answer = await _mp(c, "POST", "/v1/tables/t/items", body)
        assert status == 202 and answer == {"accepted": 1}, answer
        assert (await _tasks(c))["reserved"] == 1


async def test_a_waiting_reservation_that_becomes_stale_is_refused(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t", admission={"max_ahead": 1}, max_staleness=1)
        r = await c.post("/v1/tables/t/reservations", json={"count": 1, "version": 0})
        assert r.status_code == 201
        waiting = asyncio.create_task(
            c.post("/v1/tables/t/reservations", json={"count": 1, "version": 0, "wait_ms": 30_000})
        )
        await asyncio.sleep(0.2)
        assert not waiting.done()
        r = await c.put("/v1/tables/t/version", json={"version": 2})
        assert r.status_code == 200
        _error(await asyncio.wait_for(waiting, 20), 409, "version_conflict")
        r = await c.post("/v1/tables/t/reservations", json={"count": 1, "version": 1, "wait_ms": 0})
        _error(r, 504, "deadline_exceeded")  # fresh enough, but no room


async def test_without_delete_after_ack_every_item_expires(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t", ttl_s=3600)
        await push(c, "t", [{"key": f"k{i}", "value": i} for i in range(3)])
        lease = await claim(c, "t", task="a", batch_size=2)
        await c.post(f"/v1/tables/t/leases/{lease['lease']}:ack")
        engine = c.app.state.engine  # type: ignore[attr-defined]
        assert engine.item_expiry.sweep(now=time.time() + 7200) == 3
        stats = (await c.get("/v1/tables/t")).json()["stats"]
        assert stats["size"] == 0 and stats["expired"] == 3
        tasks = await _tasks(c)
        assert tasks["tasks"]["a"] == {"ready": 0, "leased": 0, "acked": 2, "expired": 0}


async def test_tasks_read_the_writes_answered_before(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        await create(c, "t")
        await push(c, "t", [{"key": f"k{i}", "value": i} for i in range(4)])
        await claim(c, "t", task="a", batch_size=1)
        for i in range(3):  # answered 202 before the writer applies them
            r = await c.post("/v1/tables/t/items", json={"items": [{"key": f"n{i}", "value": i}]})
            assert r.status_code == 202
        r = await c.post("/v1/tables/t/items:batchDelete", json={"keys": ["k1", "k2"]})
        assert r.status_code == 202
        assert (await _tasks(c))["tasks"]["a"] == {
            "ready": 4,
            "leased": 1,
            "acked": 0,
            "expired": 0,
        }
