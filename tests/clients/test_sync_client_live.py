"""The synchronous client against a real ``rlreplay serve`` on 127.0.0.1: the README's Python
examples as plain scripts, three threads sharing one client, calls from inside a running loop,
claims, the async client's refusal of a second loop, and ``create_table``'s default."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from rlreplay import (
    Client,
    ReplayClient,
    RolloutBatches,
    ShardedClient,
    WrongEventLoop,
)
from tests.live import REPO, running_server

pytest.importorskip("fastapi")

README_URL = "http://127.0.0.1:8000"
THREADS = 3
CALLS = 1000


def readme_python(marker: str) -> str:
    """The README's Python block that contains ``marker``."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    found = [block for block in blocks if marker in block]
    assert found, f"no Python block of README.md contains {marker!r}"
    return found[0]


SYNC_EXAMPLE = "rlreplay.Client("
ASYNC_EXAMPLE = "async with ReplayClient("


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("sync_live")) as server:
        yield server.url


@pytest.fixture
def rb(server_url: str) -> Iterator[Client]:
    with Client(server_url, backoff_s=0.01, max_backoff_s=0.05) as client:
        yield client


def run_script(code: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    script = workdir / "example.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)], cwd=workdir, capture_output=True, text=True, timeout=120
    )


def test_the_readme_examples_run_as_plain_scripts(server_url: str, tmp_path: Path) -> None:
    for marker in (SYNC_EXAMPLE, ASYNC_EXAMPLE):
        code = readme_python(marker)
        assert README_URL in code
        done = run_script(code.replace(README_URL, server_url), tmp_path)
        assert done.returncode == 0, done.stderr
        assert "items" in done.stdout
    with Client(server_url) as rb:
        assert rb.get("rollouts", "r1") is not None and rb.get("rollouts", "r2") is not None


def test_three_threads_of_push_and_sample_lose_nothing(rb: Client) -> None:
    rb.create_table("threads")
    rb.push("threads", [{"key": "seed", "value": 0}])
    errors: list[BaseException] = []
    sampled = [0] * THREADS

    def work(t: int) -> None:
        try:
            for i in range(CALLS):
                assert rb.push("threads", [{"key": f"{t}/{i}", "value": {"i": i}}]) == 1
                sampled[t] += len(rb.sample("threads", batch_size=2))
        except BaseException as exc:  # reported below, with the thread's traceback
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert errors == []
    assert sampled == [2 * CALLS] * THREADS
    stats = rb.describe_table("threads")["stats"]
    assert stats["size"] == THREADS * CALLS + 1
    assert stats["samples"] >= THREADS * CALLS
    keys = [f"{t}/{i}" for t in range(THREADS) for i in range(CALLS)]
    assert all(item is not None for item in rb.get_many("threads", keys))


def test_calls_from_inside_a_running_loop(rb: Client, server_url: str) -> None:
    async def main() -> list[int]:
        rb.create_table("in_loop")
        rb.push("in_loop", [{"key": "k", "value": np.arange(3)}])
        with rb.stream("in_loop", batch_size=4, prefetch=2) as batches:
            sizes = [len(next(batches)) for _ in range(3)]
        async with ReplayClient(server_url) as arb:  # the loop itself is free meanwhile
            assert (await arb.get("in_loop", "k")) is not None
        return sizes

    assert asyncio.run(main()) == [4, 4, 4]


def test_claims_and_rollout_batches_inside_a_running_loop(rb: Client, server_url: str) -> None:
    rb.create_table("rollouts_sync")
    rb.push("rollouts_sync", [{"key": f"r{i}", "value": {"reward": i}} for i in range(6)])
    with rb.claim("rollouts_sync", task="judge", batch_size=2) as lease:
        assert lease.keys == ["r0", "r1"] and lease.id
    assert rb.tasks("rollouts_sync")["tasks"]["judge"]["acked"] == 2

    async def main() -> list[list[str]]:
        batches = RolloutBatches(
            server_url, "rollouts_sync", task="trainer", batch_size=2, max_batches=3
        )
        return [[item["key"] for item in batch] for batch in batches]

    assert asyncio.run(main()) == [["r0", "r1"], ["r2", "r3"], ["r4", "r5"]]
    assert rb.tasks("rollouts_sync")["tasks"]["trainer"]["acked"] == 6


def test_a_second_event_loop_is_refused_before_anything_is_sent(server_url: str) -> None:
    rb = ReplayClient(server_url)

    async def first() -> None:
        await rb.create_table("two_loops")
        await rb.push("two_loops", [{"key": "first", "value": 1}], wait=True)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(first())
        with pytest.raises(WrongEventLoop, match=r"rlreplay\.Client for synchronous code"):
            asyncio.run(rb.push("two_loops", [{"key": "second", "value": 2}], wait=True))
    finally:
        loop.run_until_complete(rb.aclose())
        loop.close()
    with Client(server_url) as sync:
        assert sync.describe_table("two_loops")["stats"]["inserts"] == 1
        assert sync.get("two_loops", "second") is None


async def test_create_table_with_no_sampler_is_put_of_an_empty_config(server_url: str) -> None:
    async with httpx.AsyncClient(base_url=server_url) as http:
        put = await http.put("/v1/tables/from_put", json={})
        assert put.status_code == 201
        default = (await http.get("/v1/tables/default")).json()["config"]
    async with ReplayClient(server_url) as arb:
        made = await arb.create_table("from_client")
    assert made["config"] == put.json()["config"] == default


def test_a_sharded_client_over_two_servers(server_url: str, tmp_path: Path) -> None:
    with running_server(tmp_path / "second") as second:
        urls = [server_url, second.url]
        with ShardedClient(urls) as rb:
            rb.create_table("spread")
            keys = [f"k{i}" for i in range(200)]
            assert rb.push("spread", [{"key": k, "value": i} for i, k in enumerate(keys)]) == 200
            assert {rb.owner(k) for k in keys} == set(rb.urls)
            assert [item["value"] for item in rb.get_many("spread", keys)] == list(range(200))  # type: ignore[index]
            with rb.stream("spread", batch_size=8) as batches:
                assert len(next(batches)) == 8

            async def inside() -> int:
                return rb.describe_table("spread")["stats"]["size"]

            assert asyncio.run(inside()) == 200
            with rb.claim("spread", task="t", batch_size=4) as lease:
                assert len(lease) == 4
        assert not rb.thread.is_alive()


def test_a_consume_left_unclosed_is_released_when_the_client_closes(
    server_url: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """``for lease in rb.consume(...): break`` without ``with``: closing the client releases
    the lease in hand while its connections are still open, and prints no error (a claim
    still in flight then may come back only when its lease expires, as documented)."""
    with Client(server_url) as rb:
        rb.create_table("unclosed_consume")
        rb.push("unclosed_consume", [{"key": f"u{i}", "value": {"x": i}} for i in range(4)])
        for lease in rb.consume("unclosed_consume", task="t", batch_size=2, wait_ms=2000):
            assert len(lease.keys) == 2
            break
    with Client(server_url) as rb:
        counts = rb.tasks("unclosed_consume")["tasks"]["t"]
    assert counts["ready"] >= 2, counts
    err = capfd.readouterr().err
    assert "error occurred during closing" not in err and "transport is closed" not in err
