"""What the Ray path costs next to a plain client (``rlreplay.ray`` against ``rlreplay serve``).

Once ``rlreplay.ray.start`` has placed a server, the data path is the same HTTP as a plain
client's; what Ray adds is the sharded client the registry hands out and, in a task, the
client's reconnect. This section measures, with one server each, on a local one-node Ray:

* push (64 items of 4 KiB) and sample (256 of them), calls/s: a plain ``rlreplay.Client``
  against a server started by ``rlreplay serve``; ``rlreplay.ray.client(name)`` against the
  server ``rlreplay.ray.start`` placed, from the driver and from inside a Ray task (the client
  handed to it pickled), and ``rlreplay.ray.async_client(name)`` on the task's own event
  loop; each the median of ``--repeats`` runs of ``--duration`` seconds, the four arms
  interleaved in each repeat with both servers up;
* one-off costs, in seconds: Ray's own start, ``start`` (a server actor ready), a client by
  name, a task handed the client (unpickled there: the task's round trip included),
  ``shutdown``.

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
CAPACITY = 20_000
FLAGS = ("--no-default-table", "--durability", "none")


def _push(rb: Any, rows: np.ndarray, call: int) -> Any:
    base = call * PUSH_ITEMS % CAPACITY
    return rb.push_columns(TABLE, [f"k{base + i}" for i in range(PUSH_ITEMS)], {"x": rows})


def _rows() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (PUSH_ITEMS, ITEM_BYTES), dtype=np.uint8)


def _fill(rb: Any) -> None:
    """Create the table and fill it, so that samples draw from a full table."""
    rb.create_table(TABLE, sampler={"type": "uniform"})
    rows = _rows()
    for call in range(CAPACITY // PUSH_ITEMS):
        _push(rb, rows, call)


def _once(rb: Any, duration_s: float) -> dict[str, float]:
    """Calls/s of push and of sample through ``rb`` (any synchronous client), one run each."""
    rows = _rows()
    out = {}
    for name, call in (
        ("push", lambda i: _push(rb, rows, i)),
        ("sample", lambda i: rb.sample(TABLE, SAMPLE_ITEMS, layout="columns")),
    ):
        done, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < duration_s:
            call(done)
            done += 1
        out[name] = done / elapsed
    return out


async def _once_async(name: str, duration_s: float) -> dict[str, float]:
    """:func:`_once` with ``rlreplay.ray.async_client(name)`` on the caller's event loop."""
    import rlreplay.ray

    rows = _rows()
    out = {}
    async with rlreplay.ray.async_client(name) as rb:
        for kind, call in (
            ("push", lambda i: _push(rb, rows, i)),
            ("sample", lambda i: rb.sample(TABLE, SAMPLE_ITEMS, layout="columns")),
        ):
            done, started = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - started) < duration_s:
                await call(done)
                done += 1
            out[kind] = done / elapsed
    return out


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(run[k] for run in runs) for k in runs[0]}


def _measure(workdir: Path, duration_s: float, repeats: int) -> tuple[Any, ...]:
    """Both servers up, the arms interleaved in each repeat; the medians and one-off costs."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    import rlreplay.ray

    @ray.remote(num_cpus=0)
    def in_task(rb: Any, duration_s: float) -> dict[str, float]:
        return _once(rb, duration_s)

    @ray.remote(num_cpus=0)
    def in_task_async(name: str, duration_s: float) -> dict[str, float]:
        return asyncio.run(_once_async(name, duration_s))

    @ray.remote(num_cpus=0)
    def touch(rb: Any) -> int:
        return len(rb.urls)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_process(
        serve_command(port, workdir / "plain", *FLAGS), url, "/readyz", workdir / "plain.log"
    )
    began = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="bench")
    once = {"ray.init (a local Ray, 2 CPUs)": time.perf_counter() - began}
    try:
        plain = Client(url)
        _fill(plain)
        began = time.perf_counter()
        rlreplay.ray.start(
            "bench", num_cpus=0.5, memory_mb=256, data_root=str(workdir), serve_flags=FLAGS
        )
        once["rlreplay.ray.start (one server ready)"] = time.perf_counter() - began
        began = time.perf_counter()
        rb = rlreplay.ray.client("bench")
        once["client by name"] = time.perf_counter() - began
        _fill(rb)
        ray.get(touch.remote(rb))  # the worker's first task: not counted
        began = time.perf_counter()
        ray.get(touch.remote(rb))
        once["task given the client (round trip)"] = time.perf_counter() - began
        runs: dict[str, list[dict[str, float]]] = {
            "plain": [],
            "driver": [],
            "task": [],
            "async": [],
        }
        for _ in range(repeats):
            runs["plain"].append(_once(plain, duration_s))
            runs["driver"].append(_once(rb, duration_s))
            runs["task"].append(ray.get(in_task.remote(rb, duration_s)))
            runs["async"].append(ray.get(in_task_async.remote("bench", duration_s)))
        rb.close()
        plain.close()
        began = time.perf_counter()
        rlreplay.ray.shutdown("bench", snapshot=False)
        once["rlreplay.ray.shutdown"] = time.perf_counter() - began
    finally:
        ray.shutdown()
        stop_process(proc)
    return {k: _median(v) for k, v in runs.items()}, once


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
        medians, once = _measure(workdir, args.duration, args.repeats)
    names = {
        "plain": "rlreplay.Client, rlreplay serve",
        "driver": "rlreplay.ray.client, in the driver",
        "task": "rlreplay.ray.client, in a Ray task",
        "async": "rlreplay.ray.async_client, in a Ray task",
    }
    rows = [[names[k], m["push"], m["sample"]] for k, m in medians.items()]
    print_table(
        f"Ray path: calls/s, one server ({PUSH_ITEMS} x {ITEM_BYTES} B pushes, "
        f"{SAMPLE_ITEMS}-item samples)",
        ["client", "push calls/s", "sample calls/s"],
        rows,
    )
    print_table("Ray path: one-off costs", ["step", "seconds"], [[k, v] for k, v in once.items()])


if __name__ == "__main__":
    main()
