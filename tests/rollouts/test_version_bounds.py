"""A policy version moves only as far as a training run can: a jump of more than 1,000,000
is refused (422) unless the caller says ``force``, so a mistaken version (2^63 - 1) cannot
drop every rollout of a table with ``max_staleness`` for good."""

from __future__ import annotations

import httpx
import pytest

from rlreplay.clients import ReplayClient, ShardedReplayClient, ValidationFailed

BIGGEST = 2**63 - 1
STEP = 1_000_000


async def _table_with_rollouts(rb: ReplayClient, table: str) -> None:
    await rb.create_table(table, sampler={"type": "fifo"}, max_staleness=5)
    await rb.push(table, [{"key": f"r{i}", "value": {"x": i}, "version": i % 3} for i in range(6)])


async def test_a_jump_past_the_bound_is_refused_and_changes_nothing(
    rb: ReplayClient, server_url: str, table: str
) -> None:
    await _table_with_rollouts(rb, table)
    for version in (BIGGEST, STEP + 1):
        with pytest.raises(ValidationFailed, match="force"):
            await rb.set_version(table, version)
    async with httpx.AsyncClient(base_url=server_url) as c:
        r = await c.put(f"/v1/tables/{table}/version", json={"version": BIGGEST})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "validation_error"
        assert str(BIGGEST) in r.json()["error"]["message"]
        r = await c.put(f"/v1/tables/{table}/version", json={"version": 1, "force": "yes"})
        assert r.status_code in (400, 422), r.text
    tasks = await rb.tasks(table)
    assert tasks["version"] == 0 and tasks["dropped_stale"] == 0
    assert all(await rb.get_many(table, [f"r{i}" for i in range(6)]))


async def test_steps_up_to_the_bound_need_no_flag(rb: ReplayClient, table: str) -> None:
    await _table_with_rollouts(rb, table)
    assert (await rb.set_version(table, 2))["version"] == 2
    assert (await rb.set_version(table, 2 + STEP)) == {"version": 2 + STEP, "dropped_stale": 6}
    # the bound is relative to the current version: a run moves on from any point
    assert (await rb.set_version(table, 2 + 2 * STEP))["version"] == 2 + 2 * STEP


async def test_force_sets_any_version(rb: ReplayClient, server_url: str, table: str) -> None:
    await _table_with_rollouts(rb, table)
    assert await rb.set_version(table, BIGGEST, force=True) == {
        "version": BIGGEST,
        "dropped_stale": 6,
    }
    async with httpx.AsyncClient(base_url=server_url) as c:
        other = table + "_http"
        await rb.create_table(other, sampler={"type": "fifo"})
        r = await c.put(f"/v1/tables/{other}/version", json={"version": BIGGEST, "force": True})
        assert r.status_code == 200, r.text
        assert r.json()["version"] == BIGGEST


async def test_the_sharded_client_passes_force(server_url: str, table: str) -> None:
    async with ShardedReplayClient([server_url]) as rb:
        await rb.create_table(table, sampler={"type": "fifo"})
        with pytest.raises(ValidationFailed):
            await rb.set_version(table, BIGGEST)
        assert (await rb.set_version(table, BIGGEST, force=True))["version"] == BIGGEST


async def test_the_openapi_document_describes_force(server_url: str) -> None:
    async with httpx.AsyncClient(base_url=server_url) as c:
        doc = (await c.get("/openapi.json")).json()
    assert "force" in doc["components"]["schemas"]["VersionRequest"]["properties"]
