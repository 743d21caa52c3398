"""Rollout tables across restarts: after ``kill -9`` (or a clean stop, which checkpoints),
acknowledgements, patches, versions and request ids are kept, and items leased but not
acknowledged are ready again."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from rlreplay.clients import DeadlineExceeded, ReplayClient
from tests.live import start_server, stop_server

MODES = ["memory", "hybrid", "disk"]


@pytest.mark.parametrize("how", ["kill", "term"])
@pytest.mark.parametrize("mode", MODES)
async def test_acks_patches_versions_and_request_ids_survive_a_restart(
    tmp_path: Path, mode: str, how: str
) -> None:
    flags = ("--storage-mode", mode)
    server = start_server(tmp_path, *flags)
    try:
        async with ReplayClient(server.url, backoff_s=0.01) as rb:
            await rb.create_table("t", sampler={"type": "fifo"}, max_staleness=2)
            await rb.push(
                "t",
                [
                    {"key": f"r{i}", "value": {"prompt": i}, "group": f"g{i // 2}", "version": 3}
                    for i in range(8)
                ],
            )
            async with httpx.AsyncClient(base_url=server.url) as http:
                patch = {
                    "items": [{"key": f"r{i}", "fields": {"reward": float(i)}} for i in range(8)],
                    "request_id": "reward-batch-1",
                }
                answer = await http.post("/v1/tables/t/items:patch", json=patch)
                assert answer.status_code == 202
            acked = await rb.claim(
                "t", task="trainer", batch_size=4, fields=["reward"], group_size=2
            )
            assert await acked.ack() == 4
            held = await rb.claim("t", task="trainer", batch_size=2, fields=["reward"])
            assert held.keys == ["r4", "r5"]
            await rb.set_version("t", 4)
    finally:
        if how == "kill":
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(15)
        else:
            assert stop_server(server) in (0, -15)
    server = start_server(tmp_path, *flags)
    try:
        async with ReplayClient(server.url, backoff_s=0.01) as rb:
            item = await rb.get("t", "r6")
            assert item is not None
            assert item["value"] == {"prompt": 6, "reward": 6.0}
            assert (item["group"], item["version"]) == ("g3", 3)
            tasks = await rb.tasks("t")
            assert tasks["version"] == 4
            # r0-r3 were acknowledged; r4 and r5 were only leased: ready again, oldest first
            lease = await rb.claim("t", task="trainer", batch_size=4, fields=["reward"], wait_ms=0)
            assert lease.keys == ["r4", "r5", "r6", "r7"]
            await lease.ack()
            with pytest.raises(DeadlineExceeded):
                await rb.claim("t", task="trainer", batch_size=1, wait_ms=0)
            # the same request id after the restart: answered, and nothing changes
            async with httpx.AsyncClient(base_url=server.url) as http:
                again = {
                    "items": [{"key": "r6", "fields": {"reward": -1.0}}],
                    "request_id": "reward-batch-1",
                }
                answer = await http.post("/v1/tables/t/items:patch", json=again)
                assert answer.status_code == 202
                assert answer.json() == {"accepted": 8, "missing": 0}
            item = await rb.get("t", "r6")
            assert item is not None and item["value"]["reward"] == 6.0
    finally:
        assert stop_server(server) in (0, -15)
