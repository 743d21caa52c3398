"""A rollout table indexes every field name and task name, however many: a claim for the
70th field of a table with 100 hands out the items holding it, before and after a restart
(``kill -9`` or a clean stop), and the acknowledgements of a 70th task are kept."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from rlreplay.clients import DeadlineExceeded, ReplayClient
from tests.live import start_server, stop_server

NAMES = 100
TASKS = 70


def _value(i: int) -> dict[str, int]:
    """Item ``r{i}`` holds the fields ``f1`` to ``f{i}``."""
    return {f"f{j}": j for j in range(1, i + 1)}


@pytest.mark.parametrize("how", ["kill", "term"])
@pytest.mark.parametrize("mode", ["memory", "hybrid", "disk"])
async def test_a_table_with_100_field_names_hands_out_the_70th_across_restarts(
    tmp_path: Path, mode: str, how: str
) -> None:
    flags = ("--storage-mode", mode)
    server = start_server(tmp_path, *flags)
    try:
        async with ReplayClient(server.url, backoff_s=0.01) as rb:
            await rb.create_table("t", sampler={"type": "fifo"})
            await rb.push("t", [{"key": "r1", "value": _value(1)}], wait=True)
            # the first claim for fields: from now on every push records its fields
            first = await rb.claim("t", task="trainer", batch_size=1, fields=["f1"], wait_ms=0)
            await first.release()
            await rb.push(
                "t", [{"key": f"r{i}", "value": _value(i)} for i in range(2, NAMES + 1)], wait=True
            )
            lease = await rb.claim(
                "t", task="trainer", batch_size=NAMES, fields=["f70"], wait_ms=0, partial=True
            )
            assert lease.keys == [f"r{i}" for i in range(70, NAMES + 1)]
            assert lease.items[0]["value"] == {"f70": 70}
            await lease.ack(lease.keys[:10])  # r70-r79 consumed; the rest held, not acked
            # 70 tasks, each acknowledging the item the 70th field names first
            for n in range(TASKS):
                got = await rb.claim("t", task=f"task{n}", batch_size=1, fields=["f70"])
                assert got.keys == ["r70"]
                assert await got.ack() == 1
    finally:
        if how == "kill":
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(15)
        else:
            assert stop_server(server) in (0, -15)
    server = start_server(tmp_path, *flags)
    try:
        async with ReplayClient(server.url, backoff_s=0.01) as rb:
            lease = await rb.claim(
                "t", task="trainer", batch_size=NAMES, fields=["f70"], wait_ms=0, partial=True
            )
            assert lease.keys == [f"r{i}" for i in range(80, NAMES + 1)]
            assert lease.items[-1]["value"] == {"f70": 70}
            last = await rb.claim("t", task="new", batch_size=1, fields=["f100"], wait_ms=0)
            assert last.keys == ["r100"]
            for n in (0, 64, TASKS - 1):
                got = await rb.claim("t", task=f"task{n}", batch_size=1, fields=["f70"])
                assert got.keys == ["r71"]  # r70 stays consumed by every one of them
                await got.release()
            with pytest.raises(DeadlineExceeded):
                await rb.claim("t", task="new", batch_size=1, fields=["f100"], wait_ms=0)
    finally:
        assert stop_server(server) in (0, -15)
