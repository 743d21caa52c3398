"""``POST /sample`` and ``/priorities`` on an episode table, in-process over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from rlreplay.app.settings import Settings
from rlreplay.wire.codec import from_jsonable, packb, unpackb
from tests.api.conftest import app, client

__all__ = ["app", "client"]  # the in-process app's fixtures


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The in-process app's settings, with answers capped at 1 MiB."""
    return Settings(
        data_dir=tmp_path / "data", storage_mode="memory", max_request_mb=1, max_response_mb=1
    )


MSGPACK = "application/msgpack"


async def post(client: httpx.AsyncClient, path: str, body: Any, fmt: str = "msgpack") -> Any:
    """(status, answer) with arrays as NumPy arrays, over msgpack or JSON."""
    if fmt == "msgpack":
        headers = {"content-type": MSGPACK, "accept": MSGPACK}
        r = await client.post(path, content=packb(body), headers=headers)
        return r.status_code, unpackb(r.content)
    r = await client.post(path, json=body)
    return r.status_code, from_jsonable(r.json())


async def make_table(client: httpx.AsyncClient, name: str, **config: Any) -> None:
    body = {"episodes": {"frame_stack": {"frame": 2}}, **config}
    r = await client.put(f"/v1/tables/{name}", json=body)
    assert r.status_code == 201, r.text


async def append(
    app: FastAPI, table: str, episode: str, start: int, k: int, end: str | None = None, **kw: Any
) -> None:
    steps = {
        "obs": (np.arange(start, start + k, dtype=np.float32) + 100 * len(episode))[:, None]
        * np.ones((1, 3), np.float32),
        "frame": np.arange(start, start + k, dtype=np.uint8)[:, None] * np.ones((1, 2), np.uint8),
        "reward": np.ones(k, dtype=np.float64),
    }
    await app.state.engine.episodes.append(
        table, episode, start=start, steps=steps, end=end, wait=True, **kw
    )


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
async def test_sample_answers_windows_with_nstep_targets(
    app: FastAPI, client: httpx.AsyncClient, fmt: str
) -> None:
    await make_table(client, "eps")
    await append(app, "eps", "a", 0, 6, end="terminated")
    await append(
        app, "eps", "bb", 0, 3, end="truncated", final={"obs": np.full(3, -1.0, np.float32)}
    )
    body = {"batch_size": 32, "length": 3, "n_step": 2, "gamma": 0.5, "next_fields": ["obs"]}
    status, got = await post(client, "/v1/tables/eps/sample", body, fmt)
    assert status == 200, got
    assert len(got["episodes"]) == 32
    assert got["columns"]["obs"].shape == (32, 3, 3)
    assert got["columns"]["frame"].shape == (32, 3, 2, 2)
    assert got["mask"].shape == (32, 3) and got["mask"].all()
    for b, (episode, start) in enumerate(zip(got["episodes"], got["starts"].tolist(), strict=True)):
        length = 6 if episode == "a" else 3
        assert start + 3 <= length
        steps = start + np.arange(3)
        np.testing.assert_array_equal(got["columns"]["obs"][b, :, 0], steps + 100 * len(episode))
        # n' = min(2, L - t); rewards are 1: return = 1 + 0.5 where two steps are left
        left = length - steps
        np.testing.assert_array_equal(got["return"][b], np.where(left >= 2, 1.5, 1.0))
        terminal = episode == "a"
        # a terminated episode does not bootstrap past its last step (t + n' = L)
        want = np.where(left > 2, 0.25, 0.0) if terminal else np.where(left >= 2, 0.25, 0.5)
        np.testing.assert_array_equal(got["discount"][b], want)
        nxt = np.minimum(steps + 2, length)
        want_next = np.where(nxt == length, 0.0 if terminal else -1.0, nxt + 100 * len(episode))
        np.testing.assert_array_equal(got["next"]["obs"][b, :, 0], want_next)
    assert got["probabilities"].tolist() == [1 / 5] * 32  # starts 0..3 of a, 0 of bb
    assert got["weights"].tolist() == [1.0] * 32


async def test_windows_longer_than_any_episode_wait_then_answer_504(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    await make_table(client, "short")
    await append(app, "short", "a", 0, 4, end="terminated")
    body = {"batch_size": 2, "length": 5, "timeout_ms": 50}
    status, got = await post(client, "/v1/tables/short/sample", body)
    assert status == 504 and got["error"]["code"] == "deadline_exceeded"
    assert "longest episode holds 4" in got["error"]["message"]
    # padded windows may start at any stored step
    status, got = await post(client, "/v1/tables/short/sample", {**body, "pad": True})
    assert status == 200
    assert got["mask"].sum(axis=1).tolist() == [4 - s for s in got["starts"].tolist()]


async def test_refusals_change_nothing(app: FastAPI, client: httpx.AsyncClient) -> None:
    await make_table(client, "r")
    await append(app, "r", "a", 0, 4)
    for body in (
        {"batch_size": 1, "fields": ["nope"]},
        {"batch_size": 1, "next_fields": ["obs"]},
        {"batch_size": 1, "length": 0},
        {"batch_size": 1, "length": 100_000},  # one window past --max-response-mb
        {"batch_size": 20_000, "length": 3},  # the batch past it
        {"batch_size": 1, "keys": ["x"]},
    ):
        status, got = await post(client, "/v1/tables/r/sample", body)
        assert status == 422, (body, got)
        if body.get("length") == 100_000:
            assert "length 100000 + burn_in 0" in got["error"]["message"]
    et = app.state.engine.core.table("r").episodes
    assert et.times_sampled.sum() == 0


@pytest.mark.parametrize("extra", [{"include_values": True}, {"layout": "columns"}])
async def test_an_item_sample_body_is_told_to_pass_length(
    app: FastAPI, client: httpx.AsyncClient, extra: dict[str, Any]
) -> None:
    await make_table(client, "plain")
    await append(app, "plain", "a", 0, 4)
    status, got = await post(client, "/v1/tables/plain/sample", {"batch_size": 2, **extra})
    assert status == 422 and got["error"]["code"] == "validation_error", got
    message = got["error"]["message"]
    assert "holds episodes" in message and "pass `length`" in message
    assert f"`{next(iter(extra))}`" in message


async def test_a_sampler_that_does_not_apply_is_refused(client: httpx.AsyncClient) -> None:
    body = {"episodes": {}, "sampler": {"type": "ptime"}}
    r = await client.put("/v1/tables/p", json=body)
    assert r.status_code == 422 and "ptime" in r.json()["error"]["message"]


async def test_window_priorities_set_and_mix_td(app: FastAPI, client: httpx.AsyncClient) -> None:
    await make_table(client, "pr", sampler={"type": "prioritized", "exponent": 1.0})
    await append(app, "pr", "a", 0, 4)
    body = {
        "windows": [
            {"episode": "a", "start": 1, "priority": 3.0},
            {"episode": "z", "start": 0, "priority": 1.0},
        ]
    }
    status, got = await post(client, "/v1/tables/pr/priorities", body)
    assert status == 200 and got == {"updated": 1, "missing": 1}
    body = {"windows": [{"episode": "a", "start": 2, "td": [1.0, -3.0, 2.0]}], "eta": 0.5}
    status, got = await post(client, "/v1/tables/pr/priorities", body)
    assert status == 200 and got["updated"] == 1
    et = app.state.engine.core.table("pr").episodes
    slots = et.slots_of("a")
    assert et.priority[slots].tolist() == [1.0, 3.0, 0.5 * 3.0 + 0.5 * 2.0, 1.0]
    status, got = await post(client, "/v1/tables/pr/sample", {"batch_size": 64, "length": 1})
    assert status == 200
    total = 1.0 + 3.0 + 2.5 + 1.0
    want = {0: 1.0 / total, 1: 3.0 / total, 2: 2.5 / total, 3: 1.0 / total}
    for start, p in zip(got["starts"].tolist(), got["probabilities"].tolist(), strict=True):
        assert p == pytest.approx(want[start], rel=1e-12)
    # both forms at once, or neither, is refused and changes nothing
    for bad in (
        {"episode": "a", "start": 0},
        {"episode": "a", "start": 0, "priority": 1.0, "td": [1.0]},
    ):
        status, got = await post(client, "/v1/tables/pr/priorities", {"windows": [bad]})
        assert status == 422, got
    assert et.priority[slots][0] == 1.0


async def test_rate_limiters_count_steps_in_and_windows_out(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    await make_table(client, "lim", rate_limiter={"type": "min_size", "min_size": 5})
    await append(app, "lim", "a", 0, 4)
    body = {"batch_size": 7, "timeout_ms": 50}
    status, got = await post(client, "/v1/tables/lim/sample", body)
    assert status == 504, got  # 4 steps: below min_size
    await append(app, "lim", "b", 0, 1)
    status, got = await post(client, "/v1/tables/lim/sample", body)
    assert status == 200 and len(got["episodes"]) == 7
    limiter = app.state.engine.core.table("lim").gate.limiter
    assert (limiter.inserts, limiter.samples) == (5, 7)
    # a refused sample takes its windows back
    status, got = await post(client, "/v1/tables/lim/sample", {**body, "fields": ["nope"]})
    assert status == 422 and limiter.samples == 7


async def test_openapi_documents_the_window_forms(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]

    def forms(ref: dict[str, Any]) -> list[str]:
        name = ref["$ref"].rsplit("/", 1)[-1]
        one = schemas[name]
        both = one.get("anyOf") or one.get("oneOf") or [ref]
        return [r["$ref"].rsplit("/", 1)[-1] for r in both]

    sample = doc["paths"]["/v1/tables/{table}/sample"]["post"]
    body = sample["requestBody"]["content"]["application/json"]["schema"]
    assert forms(body) == ["SampleRequest", "WindowSampleRequest"]
    # {"batch_size": 8} samples either kind of table: the forms overlap
    assert "anyOf" in schemas[body["$ref"].rsplit("/", 1)[-1]]
    answer = sample["responses"]["200"]["content"]["application/json"]["schema"]
    assert "WindowColumns" in forms(answer)
    priorities = doc["paths"]["/v1/tables/{table}/priorities"]["post"]
    body = priorities["requestBody"]["content"]["application/json"]["schema"]
    assert forms(body) == ["PrioritiesRequest", "WindowPrioritiesRequest"]


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
async def test_a_sample_of_no_windows_answers_the_starts_mass(
    app: FastAPI, client: httpx.AsyncClient, fmt: str
) -> None:
    sampler = {"type": "prioritized", "exponent": 2.0}
    await make_table(
        client, "mass", sampler=sampler, rate_limiter={"type": "min_size", "min_size": 1}
    )
    await append(app, "mass", "a", 0, 4, priorities=[1.0, 2.0, 3.0, 4.0])
    await append(app, "mass", "bb", 0, 2, priorities=[5.0, 6.0])
    # windows of 3 may start at steps 0 and 1 of "a" only: 1^2 + 2^2
    body = {"batch_size": 0, "length": 3, "timeout_ms": 60_000}
    status, got = await post(client, "/v1/tables/mass/sample", body, fmt)
    assert status == 200, got
    assert got["episodes"] == [] and got["columns"]["obs"].shape == (0, 3, 3)
    assert (got["draw_mass"], got["selectable"]) == (5.0, 2)
    # no window of 5 anywhere: answered at once, not after its timeout
    status, got = await post(client, "/v1/tables/mass/sample", {**body, "length": 5}, fmt)
    assert status == 200 and (got["draw_mass"], got["selectable"]) == (0.0, 0)
    # a sample of windows says the same figures; the figures drew nothing
    status, got = await post(client, "/v1/tables/mass/sample", {**body, "batch_size": 4}, fmt)
    assert status == 200 and (got["draw_mass"], got["selectable"]) == (5.0, 2)
    limiter = app.state.engine.core.table("mass").gate.limiter
    assert limiter.samples == 4
    et = app.state.engine.core.table("mass").episodes
    assert et.times_sampled.sum() == 4


@pytest.mark.parametrize("n_step", [{}, {"n_step": 3}])
async def test_a_sample_of_no_windows_from_a_table_with_no_steps_answers_no_mass(
    client: httpx.AsyncClient, n_step: dict[str, int]
) -> None:
    # a sharded client asks every server this, those that hold none of the table's episodes too
    await make_table(client, "empty")
    body = {"batch_size": 0, "length": 2, "timeout_ms": 60_000, **n_step}
    status, got = await post(client, "/v1/tables/empty/sample", body, "msgpack")
    assert status == 200, got
    assert got["episodes"] == [] and (got["draw_mass"], got["selectable"]) == (0.0, 0)
