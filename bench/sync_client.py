"""The synchronous client next to the async one, against a live ``rlreplay serve``.

``rlreplay.Client`` runs each call on its own event loop thread and blocks on the answer, so
every call pays a hand-over between threads (``run_coroutine_threadsafe`` and a wait on a
``concurrent.futures.Future``) on top of the async call. This section measures what that
costs, and what several threads sharing one client win back:

* small calls: ``push`` of one small item and ``sample`` of one, calls/s;
* large calls: ``push`` of 64 items of 4 KiB and ``sample`` of 256 of them, items/s;
* the hand-over alone: microseconds per ``get`` answered in process by an
  ``httpx.MockTransport`` (no server, no socket), so that what is left is the clients' own
  work and, for ``Client``, the hand-over between threads.

Small and large calls are made by the async ``ReplayClient`` (one task; three tasks through
``asyncio.gather``) and by the synchronous ``Client`` (one thread; three threads sharing the
client), in this process, against a server in a process of its own (hybrid, ``--durability
none``, so that a push's answer does not wait for an fsync, which would hide the clients' own
costs). Each figure is the median of ``--repeats`` runs of ``--duration`` seconds, the arms
interleaved.

Run: ``python -m bench.sync_client [--duration 2] [--repeats 3] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.http import free_port, start_process, stop_process
from bench.report import print_table
from rlreplay import Client, ReplayClient
from rlreplay.app.cli import serve_command
from rlreplay.wire.codec import packb

TABLE = "sync_bench"
CAPACITY = 20_000
ITEM_BYTES = 4096
PUSH_ITEMS = 64
SAMPLE_ITEMS = 256
WORKERS = 3

#: One call of a measured kind: (client, worker number, call number) -> items it moved.
AsyncCall = Callable[[ReplayClient, int, int], Awaitable[int]]
SyncCall = Callable[[Client, int, int], int]


def _rows(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 256, (PUSH_ITEMS, ITEM_BYTES), dtype=np.uint8)


_BLOCK = _rows(np.random.default_rng(0))


def _big_push_items(worker: int, n: int) -> list[dict[str, Any]]:
    return [{"key": f"b{worker}/{n % 1000}/{i}", "value": {"x": _BLOCK[i]}} for i in range(64)]


async def _a_small_push(rb: ReplayClient, worker: int, n: int) -> int:
    return await rb.push(TABLE, [{"key": f"s{worker}/{n % 1000}", "value": {"r": 1.0}}])


async def _a_small_sample(rb: ReplayClient, worker: int, n: int) -> int:
    return len(await rb.sample(TABLE, 1))


async def _a_big_push(rb: ReplayClient, worker: int, n: int) -> int:
    return await rb.push(TABLE, _big_push_items(worker, n))


async def _a_big_sample(rb: ReplayClient, worker: int, n: int) -> int:
    return len(await rb.sample(TABLE, SAMPLE_ITEMS))


def _s_small_push(rb: Client, worker: int, n: int) -> int:
    return rb.push(TABLE, [{"key": f"s{worker}/{n % 1000}", "value": {"r": 1.0}}])


def _s_small_sample(rb: Client, worker: int, n: int) -> int:
    return len(rb.sample(TABLE, 1))


def _s_big_push(rb: Client, worker: int, n: int) -> int:
    return rb.push(TABLE, _big_push_items(worker, n))


def _s_big_sample(rb: Client, worker: int, n: int) -> int:
    return len(rb.sample(TABLE, SAMPLE_ITEMS))


#: (row name, unit, async call, sync call); the unit is calls or items.
KINDS: list[tuple[str, str, AsyncCall, SyncCall]] = [
    ("push 1 small item", "calls/s", _a_small_push, _s_small_push),
    ("sample 1", "calls/s", _a_small_sample, _s_small_sample),
    (f"push {PUSH_ITEMS} x 4 KiB", "items/s", _a_big_push, _s_big_push),
    (f"sample {SAMPLE_ITEMS} x 4 KiB", "items/s", _a_big_sample, _s_big_sample),
]


async def _async_rate(url: str, call: AsyncCall, unit: str, workers: int, seconds: float) -> float:
    async with ReplayClient(url) as rb:
        deadline = time.perf_counter() + seconds

        async def work(worker: int) -> int:
            done = 0
            for n in itertools.count():
                moved = await call(rb, worker, n)
                done += 1 if unit == "calls/s" else moved
                if time.perf_counter() >= deadline:
                    return done
            raise AssertionError("unreachable")

        t0 = time.perf_counter()
        total = sum(await asyncio.gather(*(work(w) for w in range(workers))))
        return total / (time.perf_counter() - t0)


def _sync_rate(url: str, call: SyncCall, unit: str, workers: int, seconds: float) -> float:
    with Client(url) as rb:
        deadline = time.perf_counter() + seconds
        counts = [0] * workers

        def work(worker: int) -> None:
            for n in itertools.count():
                moved = call(rb, worker, n)
                counts[worker] += 1 if unit == "calls/s" else moved
                if time.perf_counter() >= deadline:
                    return

        threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
        t0 = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(counts) / (time.perf_counter() - t0)


def measure(url: str, seconds: float, repeats: int) -> list[list[Any]]:
    """One row per kind of call: the rates of each client and its ratios."""
    rows: list[list[Any]] = []
    for name, unit, async_call, sync_call in KINDS:
        rates: dict[str, list[float]] = {"a1": [], "a3": [], "s1": [], "s3": []}
        for _ in range(repeats):  # the arms interleaved, so that drift hits them alike
            rates["a1"].append(asyncio.run(_async_rate(url, async_call, unit, 1, seconds)))
            rates["s1"].append(_sync_rate(url, sync_call, unit, 1, seconds))
            rates["a3"].append(asyncio.run(_async_rate(url, async_call, unit, WORKERS, seconds)))
            rates["s3"].append(_sync_rate(url, sync_call, unit, WORKERS, seconds))
        a1, a3, s1, s3 = (statistics.median(rates[k]) for k in ("a1", "a3", "s1", "s3"))
        rows.append([name, unit, a1, s1, f"{s1 / a1:.2f}x", a3, s3, f"{s3 / a3:.2f}x"])
    return rows


def _fixed_item(request: httpx.Request) -> httpx.Response:
    body = packb({"key": "k", "value": {"r": 1.0}, "priority": 1.0})
    return httpx.Response(200, content=body, headers={"Content-Type": "application/msgpack"})


def hand_over_us(seconds: float, repeats: int) -> list[list[Any]]:
    """Microseconds per ``get`` of each client against an in-process transport."""
    transport = httpx.MockTransport(_fixed_item)

    async def async_calls() -> float:
        async with ReplayClient("http://replay.test", transport=transport) as rb:
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                await rb.get(TABLE, "k")
                n += 1
            return (time.perf_counter() - t0) / n * 1e6

    def sync_calls() -> float:
        with Client("http://replay.test", transport=transport) as rb:
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                rb.get(TABLE, "k")
                n += 1
            return (time.perf_counter() - t0) / n * 1e6

    a, s = [], []
    for _ in range(repeats):
        a.append(asyncio.run(async_calls()))
        s.append(sync_calls())
    a_us, s_us = statistics.median(a), statistics.median(s)
    return [
        ["get, in-process transport", f"{a_us:.0f} us", f"{s_us:.0f} us", f"+{s_us - a_us:.0f} us"]
    ]


def _prefill(url: str) -> None:
    with Client(url) as rb:
        rb.create_table(TABLE, max_size=CAPACITY)
        for n in range(SAMPLE_ITEMS // PUSH_ITEMS + 1):
            rb.push(TABLE, _big_push_items(99, n), wait=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sync_client", description=__doc__)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 s runs, 1 repeat")
    args = parser.parse_args(argv)
    seconds, repeats = (1.0, 1) if args.quick else (args.duration, args.repeats)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as workdir:
        proc = start_process(
            serve_command(port, Path(workdir) / "data", "--durability", "none"),
            url,
            "/readyz",
            Path(workdir) / "log",
        )
        try:
            _prefill(url)
            rows = measure(url, seconds, repeats)
        finally:
            stop_process(proc)
    handed = hand_over_us(seconds, repeats)
    print_table(
        "Synchronous Client next to the async ReplayClient (one process, a live server)",
        [
            "call",
            "unit",
            "async, 1 task",
            "Client, 1 thread",
            "sync / async",
            f"async, {WORKERS} tasks",
            f"Client, {WORKERS} threads",
            "sync / async",
        ],
        rows,
    )
    print_table(
        "What a Client call adds: the hand-over to its loop thread and back (no server)",
        ["call", "ReplayClient", "Client", "added per call"],
        handed,
    )


if __name__ == "__main__":
    main()
