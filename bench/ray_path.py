"""What the Ray path costs next to a plain client (``rlreplay.ray`` against ``rlreplay serve``).

Once ``rlreplay.ray.start`` has placed a server, the data path is the same HTTP as a plain
client's; what Ray adds is the sharded client the registry hands out and, in a task, the
client's reconnect. This section measures, with one server each, on a local one-node Ray:

* push (64 items of 4 KiB) and sample (256 of them), calls/s: a plain ``rlreplay.Client``
  against a server started by ``rlreplay serve``; ``rlreplay.ray.client(name)`` against the
  server ``rlreplay.ray.start`` placed, from the driver and from inside a Ray task (the client
  handed to it pickled), and ``rlreplay.ray.async_client(name)`` on the task's own event
  loop; each the median of ``--repeats`` runs of ``--duration`` seconds;
* one-off costs, in seconds: ``start`` (a server actor ready), a client by name, a client
  unpickled in a task (the task's round trip included), ``shutdown``.

Servers run ``--durability none`` (hybrid), so a push's answer waits for no fsync. Ray binds
loopback here (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set before Ray is imported).

Run: ``python -m bench.ray_path [--duration 2] [--repeats 3] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.http import free_port, start_process, stop_process
from bench.report import print_table
from rlreplay import Client
from rlreplay.app.cli import serve_command

TABLE = "ray_bench"
ITEM_BYTES = 4096
PUSH_ITEMS = 64
SAMPLE_ITEMS = 256
FLAGS = ("--no-default-table", "--durability", "none")


def _calls(rb: Any, duration_s: float, repeats: int) -> dict[str, float]:
    """Median calls/s of push and of sample made through ``rb`` (any synchronous client)."""
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 256, (PUSH_ITEMS, ITEM_BYTES), dtype=np.uint8)
    counter = iter(range(10**9))

    def push() -> None:
        base = next(counter) * PUSH_ITEMS % 20_000
        rb.push_columns(TABLE, [f"k{base + i}" for i in range(PUSH_ITEMS)], {"x": rows})

    def sample() -> None:
        rb.sample(TABLE, SAMPLE_ITEMS, layout="columns")

    for _ in range(20_000 // PUSH_ITEMS):  # fill, so samples draw from a full table
        push()
    out = {}
    for name, call in (("push", push), ("sample", sample)):
        out[name] = statistics.median(_rate(call, duration_s) for _ in range(repeats))
    return out


async def _async_calls(name: str, duration_s: float, repeats: int) -> dict[str, float]:
    """:func:`_calls` with ``rlreplay.ray.async_client`` on the caller's event loop."""
    import rlreplay.ray

    rng = np.random.default_rng(0)
    rows = rng.integers(0, 256, (PUSH_ITEMS, ITEM_BYTES), dtype=np.uint8)
    out = {}
    async with rlreplay.ray.async_client(name) as rb:
        for name_, make in (
            (
                "push",
                lambda i: rb.push_columns(
                    TABLE, [f"a{i}-{j}" for j in range(PUSH_ITEMS)], {"x": rows}
                ),
            ),
            ("sample", lambda i: rb.sample(TABLE, SAMPLE_ITEMS, layout="columns")),
        ):
            rates = []
            for _ in range(repeats):
                done, started = 0, time.perf_counter()
                while (elapsed := time.perf_counter() - started) < duration_s:
                    await make(done % 300)
                    done += 1
                rates.append(done / elapsed)
            out[name_] = statistics.median(rates)
    return out


def _rate(call: Callable[[], None], duration_s: float) -> float:
    done, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < duration_s:
        call()
        done += 1
    return done / elapsed


def _plain(workdir: Path, duration_s: float, repeats: int) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_process(
        serve_command(port, workdir / "plain", *FLAGS), url, "/readyz", workdir / "plain.log"
    )
    try:
        with Client(url) as rb:
            rb.create_table(TABLE, sampler={"type": "uniform"})
            return _calls(rb, duration_s, repeats)
    finally:
        stop_process(proc)


def _ray(workdir: Path, duration_s: float, repeats: int) -> tuple[Any, ...]:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    import rlreplay.ray

    @ray.remote(num_cpus=0)
    def in_task(rb: Any, duration_s: float, repeats: int) -> dict[str, float]:
        return _calls(rb, duration_s, repeats)

    @ray.remote(num_cpus=0)
    def in_task_async(name: str, duration_s: float, repeats: int) -> dict[str, float]:
        return asyncio.run(_async_calls(name, duration_s, repeats))

    @ray.remote(num_cpus=0)
    def touch(rb: Any) -> int:
        return len(rb.urls)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="bench")
    try:
        began = time.perf_counter()
        rlreplay.ray.start(
            "bench", num_cpus=0.5, memory_mb=256, data_root=str(workdir), serve_flags=FLAGS
        )
        once = {"start": time.perf_counter() - began}
        began = time.perf_counter()
        rb = rlreplay.ray.client("bench")
        once["client by name"] = time.perf_counter() - began
        rb.create_table(TABLE, sampler={"type": "uniform"})
        ray.get(touch.remote(rb))  # the worker's first task: not counted
        began = time.perf_counter()
        ray.get(touch.remote(rb))
        once["client unpickled in a task"] = time.perf_counter() - began
        driver = _calls(rb, duration_s, repeats)
        task = ray.get(in_task.remote(rb, duration_s, repeats))
        task_async = ray.get(in_task_async.remote("bench", duration_s, repeats))
        rb.close()
        began = time.perf_counter()
        rlreplay.ray.shutdown("bench", snapshot=False)
        once["shutdown"] = time.perf_counter() - began
    finally:
        ray.shutdown()
    return driver, task, task_async, once


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ray_path")
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.repeats = 0.5, 1
    try:
        import ray  # noqa: F401
    except ImportError:
        print("\n### Ray path\n\nskipped: ray is not installed (pip install -e '.[ray]')")
        return
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        plain = _plain(workdir, args.duration, args.repeats)
        driver, task, task_async, once = _ray(workdir, args.duration, args.repeats)
    rows = [
        ["rlreplay.Client, rlreplay serve", plain["push"], plain["sample"]],
        ["rlreplay.ray.client, in the driver", driver["push"], driver["sample"]],
        ["rlreplay.ray.client, in a Ray task", task["push"], task["sample"]],
        ["rlreplay.ray.async_client, in a Ray task", task_async["push"], task_async["sample"]],
    ]
    print_table(
        f"Ray path: calls/s, one server ({PUSH_ITEMS} x {ITEM_BYTES} B pushes, "
        f"{SAMPLE_ITEMS}-item samples)",
        ["client", "push calls/s", "sample calls/s"],
        rows,
    )
    print_table("Ray path: one-off costs", ["step", "seconds"], [[k, v] for k, v in once.items()])


if __name__ == "__main__":
    main()
