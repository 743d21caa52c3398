"""Tables spread over 1, 2 and 3 local servers through ``ShardedReplayClient``.

Three ``rlreplay serve`` processes (hybrid, ``--durability wal``) on 127.0.0.1; one client in
this process. Values are ``{"x": <1 KiB uint8 array>}``. Each row is one configuration, all
measured in the same run on the same servers (each on a table of its own, uniform, capped at
20,000 items per server with the ``fifo`` remover, prefilled with 4096 items):

* baseline: the plain ``ReplayClient`` on one server;
* ``ShardedReplayClient`` over 1, 2 and 3 of the servers.

push: items/s of pushes of 64 items with new keys, 4 in flight (``asyncio.gather``); each
sharded push is split by owner, so over N servers it sends N smaller requests. sample:
items/s of ``stream(batch_size=256, prefetch=4)``; each sharded sample first reads every
server's share (a ``GET /v1/tables/{t}`` each), then samples them. claim: items/s of
``claim(batch_size=256, partial=True, wait_ms=0)`` + ``ack()`` one after another on a
``fifo`` table of 8192 fresh rollouts (pushed untimed, groups-free, 1 KiB each) until it is
drained or the time is up; a sharded claim asks each server for its share (then for the
rest when short) and acknowledges each server's part concurrently. Ratios are against the
baseline's run in the same repeat (the configurations take turns within each repeat), and
figures are medians over the repeats.

On one machine the servers and the client share its cores, so more servers cannot add
throughput here: the rows show what the fan-out costs. On N machines each server has its own
cores, disk and network, and the client's fan-out runs concurrently, so push throughput
grows with N until the client process's CPU is the limit; a sample pays one extra round
trip for the shares.

Run: ``python -m bench.sharded [--duration 1.5] [--repeats 7] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import numpy as np

from bench.http import free_port, start_process, stop_process
from bench.report import print_table
from rlreplay.app.cli import serve_command
from rlreplay.clients import ReplayClient, ShardedReplayClient

ITEM_BYTES = 1024
PUSH_ITEMS = 64
SAMPLE_ITEMS = 256
PRELOAD = 4096
CAPACITY = 20_000
IN_FLIGHT = 4
MAX_CALLS = 200_000  # per timed run, whatever the time
CLAIM_ITEMS = 256
ROLLOUTS = 8192

Client = ReplayClient | ShardedReplayClient


async def _fill(client: Client, table: str) -> None:
    await client.create_table(
        table,
        sampler={"type": "uniform"},
        remover={"type": "fifo"},
        max_size=CAPACITY,
    )
    value = np.zeros(ITEM_BYTES, dtype=np.uint8)
    for start in range(0, PRELOAD, 256):
        items = [{"key": f"pre/{i}", "value": {"x": value}} for i in range(start, start + 256)]
        await client.push(table, items, wait=True)


async def _push_rate(client: Client, table: str, seconds: float, run: int) -> float:
    rng = np.random.default_rng(run)
    values = rng.integers(0, 256, (PUSH_ITEMS, ITEM_BYTES), dtype=np.uint8)
    count = 0
    started = time.perf_counter()

    async def one(n: int) -> int:
        items = [{"key": f"r{run}/{n}/{i}", "value": {"x": values[i]}} for i in range(PUSH_ITEMS)]
        return await client.push(table, items)

    while count < MAX_CALLS and time.perf_counter() - started < seconds:
        done = await asyncio.gather(*(one(count + j) for j in range(IN_FLIGHT)))
        count += IN_FLIGHT
        assert sum(done) == IN_FLIGHT * PUSH_ITEMS
    return count * PUSH_ITEMS / (time.perf_counter() - started)


async def _sample_rate(client: Client, table: str, seconds: float) -> float:
    got = 0
    started = time.perf_counter()
    batches = client.stream(table, batch_size=SAMPLE_ITEMS, prefetch=4)
    async with aclosing(batches) as stream:  # type: ignore[type-var]
        async for batch in stream:
            got += len(batch)
            if time.perf_counter() - started > seconds or got > MAX_CALLS * SAMPLE_ITEMS:
                break
    return got / (time.perf_counter() - started)


async def _claim_rate(client: Client, table: str, seconds: float, run: int) -> float:
    value = np.zeros(ITEM_BYTES, dtype=np.uint8)
    for start in range(0, ROLLOUTS, 512):
        items = [{"key": f"c{run}/{i}", "value": {"x": value}} for i in range(start, start + 512)]
        await client.push(table, items, wait=True)
    got = 0
    started = time.perf_counter()
    while got < ROLLOUTS and time.perf_counter() - started < seconds:
        lease = await client.claim(
            table, task="bench", batch_size=CLAIM_ITEMS, wait_ms=0, partial=True
        )
        if not lease.items:
            break
        await lease.ack()
        got += len(lease.items)
    return got / (time.perf_counter() - started)


async def _measure(urls: list[str], seconds: float, repeats: int) -> list[list[Any]]:
    configs: list[tuple[str, int, Client]] = [("ReplayClient (baseline)", 1, ReplayClient(urls[0]))]
    for n in (1, 2, 3):
        configs.append(
            (
                f"ShardedReplayClient, {n} server{'s' if n > 1 else ''}",
                n,
                ShardedReplayClient(urls[:n]),
            )
        )
    figures: dict[str, dict[str, list[float]]] = {}
    try:
        for i, (_, _, client) in enumerate(configs):
            await _fill(client, f"t{i}")
            await client.create_table(f"c{i}", sampler={"type": "fifo"})
        for run in range(repeats):  # configurations interleaved: drift hits them alike
            for i, (name, _, client) in enumerate(configs):
                got = figures.setdefault(name, {"push": [], "sample": [], "claim": []})
                got["push"].append(await _push_rate(client, f"t{i}", seconds, run))
                got["sample"].append(await _sample_rate(client, f"t{i}", seconds))
                got["claim"].append(await _claim_rate(client, f"c{i}", seconds, run))
    finally:
        for _, _, client in configs:
            await client.aclose()
    base = figures[configs[0][0]]
    rows: list[list[Any]] = []
    for name, n, _ in configs:
        row: list[Any] = [name, n]
        for kind in ("push", "sample", "claim"):
            # each repeat's ratio to the baseline's run of the same repeat: drift of a shared
            # machine's load between repeats cancels
            ratios = [a / b for a, b in zip(figures[name][kind], base[kind], strict=True)]
            row += [statistics.median(figures[name][kind]), f"{statistics.median(ratios):.2f}x"]
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sharded", description=__doc__)
    parser.add_argument("--duration", type=float, default=1.5, help="seconds per timed run")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="1 s runs, one repeat")
    args = parser.parse_args(argv)
    seconds, repeats = (1.0, 1) if args.quick else (args.duration, args.repeats)
    procs = []
    with tempfile.TemporaryDirectory(prefix="rlreplay-bench-sharded-") as tmp:
        try:
            urls = []
            for i in range(3):
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                cmd = serve_command(port, Path(tmp) / f"s{i}", "--log-level", "warning")
                procs.append(start_process(cmd, url, "/readyz", Path(tmp) / f"s{i}.log"))
                urls.append(url)
            rows = asyncio.run(_measure(urls, seconds, repeats))
        finally:
            for proc in procs:
                stop_process(proc)
    print_table(
        f"Sharded client: {PUSH_ITEMS} x {ITEM_BYTES} B pushes ({IN_FLIGHT} in flight), "
        f"{SAMPLE_ITEMS}-item samples (prefetch 4), {CLAIM_ITEMS}-item claims + acks, "
        "local servers",
        [
            "client",
            "servers",
            "push items/s",
            "vs baseline",
            "sample items/s",
            "vs baseline",
            "claim+ack items/s",
            "vs baseline",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
