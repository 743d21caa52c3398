"""Rollout tables: claim + ack next to a plain sample, patch next to push, in one run.

One ``rlreplay serve`` (hybrid storage, the log on, its defaults) on 127.0.0.1 and one
Python client (:class:`rlreplay.ReplayClient`, msgpack, one request at a time), as a task of
a post-training pipeline runs it.

* claim + ack: four tasks each claim micro-batches of ``B`` rollouts with four fields
  (``fields`` names all four) and acknowledge each; rollouts of about 1 KiB and 64 KiB.
  Next to it, in the same run and interleaved round by round, a plain ``sample`` of ``B``
  from the same table. Each figure is the median round trip over the rounds; items/s is
  ``B`` over it. ``claim / sample`` compares the claim alone with the sample.
* claim latency by table size: a claim of 64 from a table of 2,000 rollouts and from one of
  100,000 (the index walks what the task has in flight, not the table).
* patch next to push: 64 items per request; the patch sets two small fields of existing
  items (``reward``, ``score``), the push writes new 1 KiB items.

TransferQueue's figures are the ones the issue states for this machine (0.1.11, one
controller and one storage unit on a local Ray), quoted, not measured here.

Run: ``python -m bench.rollouts [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

from bench.http import _wait_ready, free_port
from bench.report import print_table
from rlreplay import ReplayClient
from rlreplay.app.cli import serve_command

TASKS = ("reference", "reward", "critic", "trainer")
FIELDS = ["prompt", "response", "ref_logprob", "reward"]


def rollout(i: int, size: int) -> dict[str, object]:
    """A rollout of about ``size`` bytes with the four fields."""
    response = max(16, (size - 384) // 4)
    return {
        "key": f"r{i}",
        "value": {
            "prompt": np.full(64, i, dtype=np.int32),
            "response": np.full(response, i, dtype=np.int32),
            "ref_logprob": np.zeros(32, dtype=np.float32),
            "reward": 1.0,
        },
        "group": f"g{i // 8}",
        "version": 0,
    }


async def fill(rb: ReplayClient, table: str, n: int, size: int) -> None:
    per = max(1, min(256, (4 << 20) // size))
    for start in range(0, n, per):
        await rb.push(table, [rollout(i, size) for i in range(start, min(n, start + per))])


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    t0 = time.perf_counter()
    await call()
    return time.perf_counter() - t0


async def claims_vs_samples(rb: ReplayClient, size: int, batch: int, rounds: int) -> list[object]:
    table = f"claims_{size}"
    await rb.create_table(table, sampler={"type": "uniform"})
    await fill(rb, table, batch * rounds, size)
    claim_s: list[float] = []
    both_s: list[float] = []
    sample_s: list[float] = []
    for _ in range(rounds):
        for task in TASKS:
            t0 = time.perf_counter()
            lease = await rb.claim(table, task=task, batch_size=batch, fields=FIELDS)
            t1 = time.perf_counter()
            await lease.ack()
            t2 = time.perf_counter()
            claim_s.append(t1 - t0)
            both_s.append(t2 - t0)
            sample_s.append(await timed(lambda: rb.sample(table, batch_size=batch)))
    await rb.drop_table(table)
    claim, both, sample = (statistics.median(x) for x in (claim_s, both_s, sample_s))
    return [
        f"{size // 1024} KiB",
        batch,
        f"{claim * 1e3:.2f} ms",
        f"{both * 1e3:.2f} ms",
        1 / both,
        batch / both,
        f"{sample * 1e3:.2f} ms",
        batch / sample,
        f"{claim / sample:.2f}x",
    ]


async def latency_by_size(rb: ReplayClient, sizes: list[int], rounds: int) -> list[list[object]]:
    rows = []
    for n in sizes:
        table = f"latency_{n}"
        await rb.create_table(table, sampler={"type": "uniform"})
        await fill(rb, table, n, 1024)
        spent, claimed = [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            lease = await rb.claim(table, task="trainer", batch_size=64, fields=FIELDS)
            claimed.append(time.perf_counter() - t0)
            await lease.ack()
            spent.append(time.perf_counter() - t0)
        await rb.drop_table(table)
        median, claim = statistics.median(spent), statistics.median(claimed)
        rows.append([n, f"{claim * 1e3:.2f} ms", 64 / claim, f"{median * 1e3:.2f} ms", 64 / median])
    return rows


async def patch_vs_push(rb: ReplayClient, rounds: int) -> list[list[object]]:
    table = "patches"
    await rb.create_table(table, sampler={"type": "uniform"})
    push_s, patch_s = [], []
    for r in range(rounds):
        items = [rollout(r * 64 + i, 1024) for i in range(64)]
        push_s.append(await timed(lambda items=items: rb.push(table, items)))  # type: ignore[misc]
        fields = {it["key"]: {"reward": 0.5, "score": r} for it in items}
        patch_s.append(await timed(lambda fields=fields: rb.patch(table, fields)))  # type: ignore[misc]
    await rb.drop_table(table)
    push, patch = statistics.median(push_s), statistics.median(patch_s)
    return [
        ["push, new 1 KiB items", f"{push * 1e3:.2f} ms", 64 / push],
        ["patch, 2 fields", f"{patch * 1e3:.2f} ms", 64 / patch],
    ]


async def run(url: str, quick: bool) -> None:
    rounds = 5 if quick else 20
    async with ReplayClient(url) as rb:
        rows = [
            await claims_vs_samples(rb, 1024, 256, rounds),
            await claims_vs_samples(rb, 65536, 256, max(2, rounds // 4)),
            await claims_vs_samples(rb, 1024, 64, rounds),
        ]
        print_table(
            "Rollouts: claim + ack (4 tasks, 4 fields) next to a plain sample, same table",
            [
                "rollout",
                "batch",
                "claim",
                "claim+ack",
                "batches/s",
                "items/s",
                "sample",
                "sample items/s",
                "claim / sample",
            ],
            rows,
        )
        print_table(
            "Rollouts: a claim of 64 (values read) and claim + ack, by table size",
            ["rollouts in the table", "claim", "items/s", "claim+ack", "items/s"],
            await latency_by_size(rb, [2_000, 20_000 if quick else 100_000], rounds),
        )
        print_table(
            "Rollouts: patch next to push (64 items a request)",
            ["op", "round trip", "items/s"],
            await patch_vs_push(rb, rounds * 2),
        )
    print_table(
        "Rollouts: TransferQueue 0.1.11 as the issue measured it on this box (quoted)",
        ["op", "round trip", "rows/s"],
        [
            ["claim-and-read of 64 rows of 1 KiB, 4 fields", "17.9 ms (grows)", "3.5k"],
            ["2-field patch", "", "4.5k"],
            ["put", "", "14.2k"],
        ],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rollouts", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        proc = subprocess.Popen(
            serve_command(port, Path(data)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(url, "/readyz", proc)
            asyncio.run(run(url, args.quick))
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
