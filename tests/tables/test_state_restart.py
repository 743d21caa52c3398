"""A table's own state survives a restart: the rate limiter resumes where it was, and each
item's ``times_sampled`` and the table's counters are what they were."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from rlreplay.app.tables.config import SampleToInsertRatioLimiter, TableConfig
from rlreplay.app.tables.table import Table
from tests.live import start_server, stop_server

# samples_per_insert 1 and error_buffer 5: with 6 items in, 10 samples bring the limiter to
# its lower bound, so one more sample waits for an insert
LIMITED = {
    "rate_limiter": {
        "type": "sample_to_insert_ratio",
        "min_size_to_sample": 1,
        "samples_per_insert": 1.0,
        "error_buffer": 5.0,
    }
}


def test_the_state_dict_round_trips() -> None:
    config = TableConfig(
        rate_limiter=SampleToInsertRatioLimiter(type="sample_to_insert_ratio", error_buffer=5.0)
    )
    table = Table("t", 7, config)
    table.gate.limiter.inserts, table.gate.limiter.samples = 6, 10
    table.counters.inserts, table.counters.samples = 6, 10
    back = Table.from_state_dict("t", table.state_dict())
    assert back.tid == 7 and back.config == config
    assert back.gate.limiter.state_dict() == table.gate.limiter.state_dict()
    assert back.counters == table.counters
    assert not back.gate.limiter.can_sample(1, size=6)


def sample(client: httpx.Client, n: int) -> httpx.Response:
    return client.post("/v1/tables/t/sample", json={"batch_size": n, "timeout_ms": 300})


@pytest.mark.parametrize("mode", ["hybrid", "disk", "memory"])
def test_the_rate_limiter_and_times_sampled_resume_after_a_restart(
    tmp_path: Path, mode: str
) -> None:
    flags = ("--storage-mode", mode, "--no-default-table")
    server = start_server(tmp_path, *flags)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.put("/v1/tables/t", json=LIMITED).status_code == 201
            items = [{"key": f"k{i}", "value": i} for i in range(6)]
            pushed = client.post("/v1/tables/t/items", json={"items": items, "wait": True})
            assert pushed.status_code == 200, pushed.text
            assert sample(client, 10).status_code == 200
            assert sample(client, 1).status_code == 504  # the limiter holds it
            before = client.post("/v1/tables/t/items:batchGet", json={"keys": ["k0", "k1"]})
            stats = client.get("/v1/tables/t").json()["stats"]
    finally:
        assert stop_server(server) in (0, -15)  # uvicorn ends by the signal it got
    server = start_server(tmp_path, *flags)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            # a limiter counted from zero would let this sample through at once
            assert sample(client, 1).status_code == 504
            after = client.post("/v1/tables/t/items:batchGet", json={"keys": ["k0", "k1"]})
            assert [it["times_sampled"] for it in after.json()["items"]] == [
                it["times_sampled"] for it in before.json()["items"]
            ]
            all_items = client.post(
                "/v1/tables/t/items:batchGet", json={"keys": [f"k{i}" for i in range(6)]}
            ).json()["items"]
            assert sum(it["times_sampled"] for it in all_items) == 10
            again = client.get("/v1/tables/t").json()["stats"]
            assert (again["inserts"], again["samples"]) == (stats["inserts"], stats["samples"])
            # one more insert moves the limiter on by exactly one sample
            one = {"items": [{"key": "k6", "value": 6}], "wait": True}
            assert client.post("/v1/tables/t/items", json=one).status_code == 200
            assert sample(client, 1).status_code == 200
            assert sample(client, 1).status_code == 504
    finally:
        assert stop_server(server) in (0, -15)  # uvicorn ends by the signal it got
