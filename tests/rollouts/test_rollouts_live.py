"""Rollout tables over a real server: fields written by several tasks, claims per task
under leases, acknowledgements, policy versions, idempotent writes."""

from __future__ import annotations

import asyncio
import random

import httpx
import numpy as np
import pytest

from rlreplay.clients import (
    DeadlineExceeded,
    LeaseNotFound,
    ReplayClient,
    ValidationFailed,
    VersionConflict,
)

GEN, REF, RM, TRAINER = "generator", "reference", "reward", "trainer"


async def fresh(rb: ReplayClient, table: str, **config: object) -> None:
    await rb.create_table(table, sampler={"type": "fifo"}, **config)  # type: ignore[arg-type]


def rollout(i: int, group: str | None = None, version: int | None = None) -> dict[str, object]:
    item: dict[str, object] = {
        "key": f"r{i}",
        "value": {"prompt": np.arange(4, dtype=np.int32) + i, "response": f"answer {i}"},
    }
    if group is not None:
        item["group"] = group
    if version is not None:
        item["version"] = version
    return item


async def test_fields_from_three_tasks_in_any_order_make_an_item_claimable(
    rb: ReplayClient, table: str
) -> None:
    await fresh(rb, table)
    await rb.push(table, [rollout(i) for i in range(6)])
    writes = [
        ("ref_logprob", {f"r{i}": {"ref_logprob": float(-i)} for i in range(6)}),
        ("reward", {f"r{i}": {"reward": float(i)} for i in range(6)}),
        ("score", {f"r{i}": {"score": i} for i in range(6)}),
    ]
    random.Random(7).shuffle(writes)
    want = ["prompt", "ref_logprob", "reward", "score"]
    for name, fields in writes:
        lease = await rb.claim(
            table, task=TRAINER, batch_size=6, fields=want, wait_ms=0, partial=True
        )
        assert lease.items == [], f"handed out before {name} arrived"
        answer = await rb.patch(table, fields)
        assert answer == {"accepted": 6, "missing": 0}
    got = await rb.get(table, "r3")
    assert got is not None
    assert set(got["value"]) == {"prompt", "response", "ref_logprob", "reward", "score"}
    lease = await rb.claim(table, task=TRAINER, batch_size=6, fields=want)
    assert [it["key"] for it in lease.items] == [f"r{i}" for i in range(6)]  # oldest first
    assert all(set(it["value"]) == set(want) for it in lease.items)  # only what was asked
    assert lease.items[2]["value"]["reward"] == 2.0
    np.testing.assert_array_equal(lease.items[2]["value"]["prompt"], np.arange(4) + 2)
    await lease.ack()


async def test_a_claim_gets_only_items_with_every_field_asked_for(
    rb: ReplayClient, table: str
) -> None:
    await fresh(rb, table)
    await rb.push(table, [rollout(i) for i in range(10)])
    await rb.patch(table, {f"r{i}": {"reward": 1.0} for i in range(0, 10, 2)})
    lease = await rb.claim(
        table, task=TRAINER, batch_size=10, fields=["reward"], wait_ms=0, partial=True
    )
    assert [it["key"] for it in lease.items] == [f"r{i}" for i in range(0, 10, 2)]
    answer = await rb.patch(table, {"nope": {"reward": 1.0}, "r1": {"reward": 0.5}})
    assert answer == {"accepted": 1, "missing": 1}


async def test_whole_groups_only_oldest_first(rb: ReplayClient, table: str) -> None:
    await fresh(rb, table)
    items = [rollout(i, group=f"p{i % 3}") for i in range(9)]  # groups p0, p1, p2 of 3
    await rb.push(table, items)
    await rb.patch(table, {f"r{i}": {"reward": 1.0} for i in range(9) if i != 4})  # p1 short
    lease = await rb.claim(
        table, task=TRAINER, batch_size=6, fields=["reward"], group_size=3, wait_ms=0, partial=True
    )
    groups = [it["group"] for it in lease.items]
    assert groups == ["p0"] * 3 + ["p2"] * 3
    with pytest.raises(ValidationFailed):
        await rb.claim(table, task=TRAINER, batch_size=4, group_size=3)
    with pytest.raises(DeadlineExceeded):
        await rb.claim(
            table, task=TRAINER, batch_size=3, fields=["reward"], group_size=3, wait_ms=50
        )
    await rb.patch(table, {"r4": {"reward": 1.0}})
    more = await rb.claim(table, task=TRAINER, batch_size=3, fields=["reward"], group_size=3)
    assert [it["group"] for it in more.items] == ["p1"] * 3


async def test_each_task_consumes_each_item_once(rb: ReplayClient, table: str) -> None:
    await fresh(rb, table)
    await rb.push(table, [rollout(i) for i in range(20)])
    seen: dict[str, list[str]] = {REF: [], RM: []}
    for task in (REF, RM):
        for _ in range(4):
            lease = await rb.claim(table, task=task, batch_size=5)
            async with lease:
                seen[task] += lease.keys
        with pytest.raises(DeadlineExceeded):
            await rb.claim(table, task=task, batch_size=1, wait_ms=50)
    assert seen[REF] == seen[RM] == [f"r{i}" for i in range(20)]
    counts = (await rb.tasks(table))["tasks"]
    assert counts[REF] == {"ready": 0, "leased": 0, "acked": 20, "expired": 0}


async def test_release_and_lease_expiry_hand_items_out_again(rb: ReplayClient, table: str) -> None:
    await fresh(rb, table)
    await rb.push(table, [rollout(i) for i in range(4)])
    first = await rb.claim(table, task=TRAINER, batch_size=2)
    second = await rb.claim(table, task=TRAINER, batch_size=2)
    assert first.keys == ["r0", "r1"] and second.keys == ["r2", "r3"]
    assert await first.release(["r1"]) == 1
    again = await rb.claim(table, task=TRAINER, batch_size=1)
    assert again.keys == ["r1"]
    short = await rb.claim(table, task=REF, batch_size=4, lease_s=0.2)
    assert short.keys == [f"r{i}" for i in range(4)]
    # expiry: the same items come back to the task, once the server released them
    back = await rb.claim(table, task=REF, batch_size=4, wait_ms=20_000)
    assert back.keys == [f"r{i}" for i in range(4)]
    with pytest.raises(LeaseNotFound):
        await short.ack()
    counts = (await rb.tasks(table))["tasks"][REF]
    assert counts["expired"] == 4 and counts["leased"] == 4


async def test_ack_of_an_unknown_lease_is_404_lease_not_found(
    server_url: str, rb: ReplayClient, table: str
) -> None:
    await fresh(rb, table)
    async with httpx.AsyncClient(base_url=server_url) as http:
        answer = await http.post(f"/v1/tables/{table}/leases/no-such-lease:ack", json={})
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "lease_not_found"


async def test_a_retried_ack_changes_nothing(rb: ReplayClient, table: str) -> None:
    await fresh(rb, table)
    await rb.push(table, [rollout(i) for i in range(3)])
    lease = await rb.claim(table, task=TRAINER, batch_size=3)
    assert await lease.ack() == 3
    assert await lease.ack() == 3
    assert (await rb.tasks(table))["tasks"][TRAINER]["acked"] == 3


async def test_a_waiting_claim_is_answered_when_the_last_field_arrives(
    rb: ReplayClient, table: str
) -> None:
    await fresh(rb, table)
    await rb.push(table, [rollout(i) for i in range(2)])
    await rb.patch(table, {"r0": {"reward": 1.0}})
    waiting = asyncio.create_task(
        rb.claim(table, task=TRAINER, batch_size=2, fields=["reward"], wait_ms=30_000)
    )
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await rb.patch(table, {"r1": {"reward": 2.0}})
    lease = await asyncio.wait_for(waiting, 30)
    assert lease.keys == ["r0", "r1"]


async def test_staleness_drops_and_deletes(rb: ReplayClient, table: str) -> None:
    await fresh(rb, table, max_staleness=1)
    await rb.push(table, [rollout(i, version=i % 3) for i in range(6)])  # versions 0, 1, 2
    answer = await rb.set_version(table, 2)
    assert answer == {"version": 2, "dropped_stale": 2}  # version 0 < 2 - 1
    assert await rb.get(table, "r0") is None and await rb.get(table, "r3") is None
    sampled = await rb.sample(table, batch_size=50)
    assert {it["key"] for it in sampled} <= {"r1", "r2", "r4", "r5"}
    assert {it["version"] for it in sampled} <= {1, 2}
    lease = await rb.claim(table, task=TRAINER, batch_size=4)
    assert lease.keys == ["r1", "r2", "r4", "r5"]
    await rb.push(table, [rollout(9, version=0)])  # already stale: dropped
    assert await rb.get(table, "r9") is None
    with pytest.raises(VersionConflict):
        await rb.set_version(table, 1)
    tasks = await rb.tasks(table)
    assert tasks["version"] == 2 and tasks["dropped_stale"] == 3


async def test_delete_after_ack_deletes_once_every_task_acked(rb: ReplayClient, table: str) -> None:
    await fresh(rb, table, delete_after_ack=[REF, TRAINER])
    await rb.push(table, [rollout(i) for i in range(4)])
    async with await rb.claim(table, task=TRAINER, batch_size=4):
        pass
    assert (await rb.describe_table(table))["stats"]["size"] == 4
    async with await rb.claim(table, task=REF, batch_size=2):
        pass
    assert await rb.get(table, "r0") is None and await rb.get(table, "r1") is None
    assert await rb.get(table, "r2") is not None
    assert (await rb.describe_table(table))["stats"]["size"] == 2


async def test_group_and_version_come_back_on_get_and_sample(rb: ReplayClient, table: str) -> None:
    await fresh(rb, table)
    await rb.push(table, [rollout(0, group="p", version=3), rollout(1)])
    item = await rb.get(table, "r0")
    assert item is not None and item["group"] == "p" and item["version"] == 3
    plain = await rb.get(table, "r1")
    assert plain is not None and "group" not in plain
    picks = await rb.sample(table, batch_size=2)  # fifo: the oldest, r0
    assert {(it["key"], it.get("group"), it.get("version")) for it in picks} == {("r0", "p", 3)}
    await rb.delete(table, ["r0"])
    picks = await rb.sample(table, batch_size=2)
    assert {(it["key"], it.get("group"), it.get("version")) for it in picks} == {("r1", None, None)}


async def test_a_repeated_request_id_changes_nothing(
    server_url: str, rb: ReplayClient, table: str
) -> None:
    await fresh(rb, table)
    async with httpx.AsyncClient(base_url=server_url) as http:
        push = {"items": [{"key": "a", "value": {"x": 1}}], "request_id": "push-1"}
        assert (await http.post(f"/v1/tables/{table}/items", json=push)).status_code == 202
        patch = {"items": [{"key": "a", "fields": {"y": 2}}], "request_id": "patch-1"}
        assert (await http.post(f"/v1/tables/{table}/items:patch", json=patch)).json() == {
            "accepted": 1,
            "missing": 0,
        }
        lease = await rb.claim(table, task=TRAINER, batch_size=1)
        await lease.ack()
        # the same push again would replace the item (a new rollout, to consume again)
        again = await http.post(f"/v1/tables/{table}/items", json=push)
        assert again.status_code == 202 and again.json() == {"accepted": 1}
        with pytest.raises(DeadlineExceeded):
            await rb.claim(table, task=TRAINER, batch_size=1, wait_ms=50)
        other = {"items": [{"key": "a", "fields": {"y": 3}}], "request_id": "patch-1"}
        assert (await http.post(f"/v1/tables/{table}/items:patch", json=other)).status_code == 202
        item = await rb.get(table, "a")
        assert item is not None and item["value"] == {"x": 1, "y": 2}
        delete = {"keys": ["a"], "request_id": "del-1"}
        assert (await http.post(f"/v1/tables/{table}/items:batchDelete", json=delete)).json() == {
            "accepted": 1
        }
        await rb.push(table, [{"key": "a", "value": {"x": 5}}])
        assert (await http.post(f"/v1/tables/{table}/items:batchDelete", json=delete)).json() == {
            "accepted": 1
        }
        assert await rb.get(table, "a") is not None


async def test_consume_acks_each_batch_as_the_next_is_asked_for(
    rb: ReplayClient, table: str
) -> None:
    await fresh(rb, table)
    await rb.push(table, [rollout(i, group=f"g{i // 2}") for i in range(8)])
    seen: list[str] = []
    batches = rb.consume(table, task=TRAINER, batch_size=2, group_size=2, prefetch=2)
    async for lease in batches:
        seen += lease.keys
        if len(seen) == 6:
            break
    await batches.aclose()
    assert len(set(seen)) == 6  # prefetched claims may answer in any order
    counts = (await rb.tasks(table))["tasks"][TRAINER]
    # the first two were acknowledged, the one in hand released; a prefetched claim the
    # server answered as the loop closed holds its items until its lease expires
    assert counts["acked"] == 4 and counts["leased"] + counts["ready"] == 4


async def test_consume_acks_the_lease_in_hand_while_the_next_claim_waits(
    rb: ReplayClient, table: str
) -> None:
    """A lease the caller is done with is acknowledged when the next one is asked for, not
    when the next one comes: a wait for new items longer than the lease must not let it
    expire and hand its items out again."""
    await fresh(rb, table)
    await rb.push(table, [rollout(i) for i in range(2)], wait=True)
    batches = rb.consume(table, task=TRAINER, batch_size=2, lease_s=1.0, wait_ms=100)
    first = await anext(batches)

    async def push_later() -> None:
        await asyncio.sleep(2.5)  # past the first lease's expiry, had it not been acked
        await rb.push(table, [rollout(i) for i in range(2, 4)], wait=True)

    second, _ = await asyncio.gather(anext(batches), push_later())
    await batches.aclose()
    assert first.keys == ["r0", "r1"] and second.keys == ["r2", "r3"]
    counts = (await rb.tasks(table))["tasks"][TRAINER]
    assert counts["acked"] == 2 and counts["expired"] == 0


def test_the_dataset_yields_each_micro_batch_once(server_url: str, table: str) -> None:
    torch = pytest.importorskip("torch")
    from rlreplay.clients import rollout_dataset

    async def fill() -> None:
        async with ReplayClient(server_url) as rb:
            await fresh(rb, table)
            await rb.push(table, [rollout(i) for i in range(6)])

    asyncio.run(fill())
    dataset = rollout_dataset(server_url, table, task=TRAINER, batch_size=2, max_batches=3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None)
    keys = [[item["key"] for item in batch] for batch in loader]
    assert keys == [["r0", "r1"], ["r2", "r3"], ["r4", "r5"]]

    async def counts() -> dict[str, int]:
        async with ReplayClient(server_url) as rb:
            answer: dict[str, int] = (await rb.tasks(table))["tasks"][TRAINER]
            return answer

    assert asyncio.run(counts()) == {"ready": 0, "leased": 0, "acked": 6, "expired": 0}


async def test_per_task_counts_are_in_metrics(
    server_url: str, rb: ReplayClient, table: str
) -> None:
    await fresh(rb, table)
    await rb.push(table, [rollout(i) for i in range(3)])
    async with await rb.claim(table, task=REF, batch_size=2):
        pass
    labels = f'table="{table}",task="{REF}"'
    wanted = [
        f'rlreplay_task_items{{{labels},state="ready"}} 1.0',
        f"rlreplay_task_acked_total{{{labels}}} 2.0",
    ]
    deadline = asyncio.get_running_loop().time() + 30  # the scrape's text is reused for 1 s
    async with httpx.AsyncClient(base_url=server_url) as http:
        while True:
            text = (await http.get("/metrics")).text
            if all(line in text for line in wanted) or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.2)
    for line in wanted:
        assert line in text
