"""A claim is capped by ``--max-response-mb`` like sample and batchGet: one whose answer
would pass it is refused with 422 ``validation_error`` before it is built, and leaves
nothing leased (its items are ready for the task at once)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from rlreplay.clients import ReplayClient, ValidationFailed
from tests.live import running_server

ITEMS = 40
BIG = 64 * 1024  # 40 items of 64 KiB: 2.5 MiB, past a cap of 1 MiB


@pytest.fixture(scope="module")
def capped_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    flags = ("--max-response-mb", "1")
    with running_server(tmp_path_factory.mktemp("claim-cap"), *flags) as server:
        yield server.url


@pytest.fixture
async def rb(capped_url: str, table: str) -> AsyncIterator[ReplayClient]:
    async with ReplayClient(capped_url, backoff_s=0.01) as client:
        await client.create_table(table, sampler={"type": "fifo"})
        items = [
            {"key": f"r{i:02d}", "value": {"big": bytes(BIG), "small": i}, "group": f"g{i // 4}"}
            for i in range(ITEMS)
        ]
        await client.push(table, items, wait=True)
        yield client


@pytest.mark.parametrize("fields", [None, ["big", "small"], ["big"]])
async def test_a_claim_past_the_cap_is_refused_and_leaves_nothing_leased(
    rb: ReplayClient, capped_url: str, table: str, fields: list[str] | None
) -> None:
    with pytest.raises(ValidationFailed, match="max-response-mb"):
        await rb.sample(table, batch_size=ITEMS)
    body = {"task": "t", "batch_size": ITEMS, "wait_ms": 0}
    if fields is not None:
        body["fields"] = fields
    async with httpx.AsyncClient(base_url=capped_url) as http:
        answer = await http.post(f"/v1/tables/{table}/claim", json=body)
    assert answer.status_code == 422, answer.text[:200]
    assert answer.json()["error"]["code"] == "validation_error"
    assert "--max-response-mb" in answer.json()["error"]["message"]
    with pytest.raises(ValidationFailed):
        await rb.claim(table, task="t", batch_size=ITEMS, group_size=4, fields=fields, wait_ms=0)
    tasks = (await rb.tasks(table))["tasks"]
    assert tasks["t"]["leased"] == 0
    # every item is still ready for the task: a claim that fits takes the oldest
    lease = await rb.claim(table, task="t", batch_size=8, fields=fields, wait_ms=0)
    assert lease.keys == [f"r{i:02d}" for i in range(8)]


async def test_values_cut_to_small_fields_fit_under_the_cap(rb: ReplayClient, table: str) -> None:
    lease = await rb.claim(table, task="t", batch_size=ITEMS, fields=["small"], wait_ms=0)
    assert len(lease.items) == ITEMS
    assert lease.items[-1]["value"] == {"small": ITEMS - 1}
