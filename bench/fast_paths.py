"""Each hand-written fast path, on and off in the same run: the gain it earns.

* hot routes (``app/api/hot.py``): the data routes past Starlette's routing and FastAPI's
  resolver, against ``--no-hot-routes`` (every request through FastAPI): wrk pushes of
  64 x 4 KiB and samples of 256 x 4 KiB (msgpack), ``durability none`` so that the log's
  fsyncs do not hide the routing's cost.
* the client's own HTTP/1.1 transport (``clients/transport.py``), against httpx's default
  transport (``lean_transport=False``): ``ReplayClient.stream()`` items/s and the client's
  CPU per batch, from a process of its own, against one server.
* the whole-body hand-over (``GuardedHttpToolsProtocol``, ``app/api/connections.py``), against
  handing a body over in pieces of 64 KiB, uvicorn's flow-control window (the server started
  with ``BODY_HOLD_BYTES`` at 64 KiB): wrk pushes of new keys into a table capped at
  50,000, and pushes replacing the same keys, ``durability none``.
* the client decoding an answer in the buffer the socket read into, against a ``bytes`` copy
  of it first (``Connection.readexactly`` wrapped in the client process): ``stream()`` CPU per
  batch, as for the transport.
* a columnar push's items joined from slices of its columns (``app/tables/unstacking.py``,
  ``JOIN_ROW_BYTES``), against cutting them from one side-by-side buffer: in process, µs to
  build the values of a push of 64 x 4 KiB, alternate rounds.
* the log writer process (``--wal-writer process``), against flushes in a thread of the
  server (``--wal-writer thread``): wrk pushes with ``durability wal``.
* the writer joining queued pushes into one op (``TaskProcessor.join_pushes``), against
  applying them one by one: in process, 16 pushers of 64 new keys x 4 KiB into a ``hybrid``
  table capped at 50,000 (``wal``), the two arms in alternate rounds of one process; the
  figure is the event loop's CPU per pushed item (parsing, admission and the writer).

Every figure is a median over pairs of runs, the two arms back to back (alternating which
goes first); the ratio column is the median of the pairs' ratios on/off.

Run: ``python -m bench.fast_paths [--duration 4] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.http import (
    KEY_MARK,
    PRELOAD,
    PUSH_BODIES,
    PUSH_ITEMS,
    SAMPLE_BODY,
    SAMPLE_ITEMS,
    _push_template,
    free_port,
    paired,
    parse_wrk_arguments,
    push_body,
    start_process,
    stop_process,
    wrk_arguments,
)
from bench.report import print_table
from rlreplay.app.cli import serve_command

_STREAM = """
import asyncio, resource, sys, time
from rlreplay.clients import ReplayClient, tune_malloc

tune_malloc()

async def main(url, seconds, arm):
    if arm == "copy":  # the off arm of the in-place decode: a bytes copy of each long answer
        from rlreplay.clients.connection import Connection

        in_place = Connection.readexactly

        async def readexactly(self, size, timeout_s):
            return bytes(await in_place(self, size, timeout_s))

        Connection.readexactly = readexactly
    async with ReplayClient(url, lean_transport=arm != "httpx") as rb:
        got = batches = 0
        cpu0, started = time.process_time(), time.perf_counter()
        async for batch in rb.stream("default", batch_size=%d, prefetch=4):
            got += len(batch)
            batches += 1
            if time.perf_counter() - started > seconds:
                break
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
        print(got / wall, cpu / batches * 1e6)

asyncio.run(main(sys.argv[1], float(sys.argv[2]), sys.argv[3]))
"""


#: Starts the service with request bodies handed over in pieces of 64 KiB, as uvicorn does.
_PIECEWISE = (
    "import runpy, sys; import rlreplay.app.api.connections as c; c.BODY_HOLD_BYTES = 64 << 10; "
    "sys.argv[0] = 'rlreplay.app'; runpy.run_module('rlreplay.app', run_name='__main__')"
)


def _serve(
    workdir: Path, name: str, *flags: str, piecewise: bool = False
) -> tuple[str, subprocess.Popen[bytes]]:
    """A server with ``flags``, its default table preloaded for samples."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = serve_command(
        port, workdir / f"data-{name}", "--cache-memory-limit-mb", "2048", *flags
    )
    if piecewise:
        command[1:3] = ["-c", _PIECEWISE]
    proc = start_process(
        command,
        url,
        "/readyz",
        workdir / f"server-{name}.log",
    )
    with httpx.Client(base_url=url, timeout=60) as c:
        c.put("/v1/tables/bench", json={"max_size": 50_000}).raise_for_status()
        for n in range(PRELOAD // PUSH_ITEMS):
            c.post(
                "/v1/tables/default/items",
                content=push_body(1000 + n),
                headers={"content-type": "application/msgpack"},
            ).raise_for_status()
    return url, proc


def _server_pair(
    workdir: Path, args: argparse.Namespace, off: tuple[str, ...], on: tuple[str, ...]
) -> list[tuple[str, float, float, float]]:
    """Push and sample rates of two servers, ``off`` and ``on`` flags, paired."""
    bodies = [push_body(n) for n in range(PUSH_BODIES)]
    url_off, proc_off = _serve(workdir, "off", *off)
    try:
        url_on, proc_on = _serve(workdir, "on", *on)
        try:
            urls = (url_off, url_on)
            push = paired(
                tuple(u + "/v1/tables/bench/items" for u in urls),  # type: ignore[arg-type]
                bodies,
                PUSH_ITEMS,
                args,
                workdir,
            )
            sample = paired(
                tuple(u + "/v1/tables/default/sample" for u in urls),  # type: ignore[arg-type]
                [SAMPLE_BODY],
                SAMPLE_ITEMS,
                args,
                workdir,
            )
        finally:
            stop_process(proc_on)
    finally:
        stop_process(proc_off)
    return [("push", push[1], push[0], push[2]), ("sample", sample[1], sample[0], sample[2])]


def _hand_over_pair(workdir: Path, args: argparse.Namespace) -> list[list[object]]:
    """Pushes into servers with and without the whole-body hand-over (``durability none``):
    new keys into the capped table, and pushes replacing the same keys."""
    none = ("--durability", "none")
    url_off, proc_off = _serve(workdir, "pieces", *none, piecewise=True)
    rows: list[list[object]] = []
    try:
        url_on, proc_on = _serve(workdir, "whole", *none)
        try:
            urls = (url_off + "/v1/tables/bench/items", url_on + "/v1/tables/bench/items")
            for what, bodies in (
                ("new keys", [_push_template() for _ in range(PUSH_BODIES)]),
                ("replacing", [push_body(n) for n in range(PUSH_BODIES)]),
            ):
                off, on, ratio, _bad = paired(urls, bodies, PUSH_ITEMS, args, workdir)
                rows.append([f"whole-body hand-over: push items/s, {what} (none)", on, off, ratio])
        finally:
            stop_process(proc_on)
    finally:
        stop_process(proc_off)
    return rows


def _stream_once(url: str, seconds: float, arm: str) -> tuple[float, float]:
    """``stream()`` items/s and client CPU µs per batch, from a process of its own; ``arm``:
    ``lean`` (as shipped), ``httpx`` (httpx's transport) or ``copy`` (no in-place decode)."""
    out = subprocess.run(
        [sys.executable, "-c", _STREAM % SAMPLE_ITEMS, url, str(seconds), arm],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    ).stdout
    rate, cpu_us = out.split()
    return float(rate), float(cpu_us)


def _client_pairs(workdir: Path, args: argparse.Namespace) -> list[list[object]]:
    """The client's fast paths against one server: each off arm paired with the shipped
    client (``lean``), alternating which goes first."""
    url, proc = _serve(workdir, "stream", "--durability", "none")
    rows: list[list[object]] = []
    med = statistics.median
    try:
        for off, what, by_cpu in (
            ("httpx", "client transport: stream() items/s (client CPU µs per batch)", False),
            ("copy", "client in-place decode: stream() client CPU µs per batch (items/s)", True),
        ):
            rates: dict[str, list[float]] = {"lean": [], off: []}
            cpus: dict[str, list[float]] = {"lean": [], off: []}
            first, second = (cpus, rates) if by_cpu else (rates, cpus)
            ratios = []
            for i in range(args.repeats):
                for arm in (off, "lean") if i % 2 == 0 else ("lean", off):
                    rate, cpu = _stream_once(url, args.duration, arm)
                    rates[arm].append(rate)
                    cpus[arm].append(cpu)
                ratios.append(first["lean"][-1] / first[off][-1])
            cells = [f"{med(first[a]):,.0f} ({med(second[a]):,.0f})" for a in ("lean", off)]
            rows.append([what, *cells, med(ratios)])
    finally:
        stop_process(proc)
    return rows


async def _join_rounds(workdir: Path, rounds: int, pushes: int) -> tuple[float, float, float]:
    """Median event-loop CPU µs per item with joining on and off, and the median ratio of
    adjacent rounds (on / off)."""
    from rlreplay.app.api.bodies import BodyFormat
    from rlreplay.app.api.column_bodies import parse_any_push
    from rlreplay.app.engine.engine import Engine
    from rlreplay.app.settings import Settings
    from rlreplay.app.tables.config import TableConfig
    from rlreplay.app.writer.task_processor import TaskProcessor

    template, counter = _push_template(), 0
    join = TaskProcessor.join_pushes

    def bodies(n: int) -> list[bytes]:
        nonlocal counter
        counter += n
        return [template.replace(KEY_MARK, b"%010d" % (counter - i)) for i in range(n)]

    eng = Engine(
        Settings(data_dir=workdir / "join", storage_mode="hybrid", cache_memory_limit_mb=2048)
    )
    await eng.start()
    await eng.create_table("fresh", TableConfig(max_size=50_000))

    async def pusher(chunk: list[bytes]) -> None:
        for body in chunk:
            push = parse_any_push(body, BodyFormat.MSGPACK)
            await eng.push("fresh", push.items, validated=True, body=push.raw)

    async def run(batch: list[bytes]) -> float:
        started = time.thread_time()
        await asyncio.gather(*(pusher(batch[i::16]) for i in range(16)))
        await eng.flush()
        return (time.thread_time() - started) / (len(batch) * PUSH_ITEMS) * 1e6

    per: tuple[list[float], list[float]] = ([], [])
    try:
        await run(bodies(60_000 // PUSH_ITEMS))  # full: every push also trims 64
        for r in range(2 * rounds):
            on = r % 2 == 0
            TaskProcessor.join_pushes = join if on else _one_push  # type: ignore[method-assign]
            batch = bodies(pushes)
            per[0 if on else 1].append(await run(batch))
    finally:
        TaskProcessor.join_pushes = join  # type: ignore[method-assign]
        await eng.stop()
    ratios = [a / b for a, b in zip(*per, strict=True)]
    return statistics.median(per[0]), statistics.median(per[1]), statistics.median(ratios)


def _unstack_rounds(rounds: int) -> tuple[float, float, float]:
    """Median µs to build the values of a columnar push of 64 x 4 KiB with the values joined
    from slices and cut from one buffer, and the median ratio of adjacent rounds."""
    import numpy as np

    from rlreplay.app.tables import unstacking

    data = np.random.default_rng(0).integers(0, 255, (PUSH_ITEMS, 4096), dtype=np.uint8)
    column = unstacking.ColumnIn("x", "|u1", data.shape, data.reshape(-1).data)
    join_bytes = unstacking.JOIN_ROW_BYTES

    def one_round(calls: int = 400) -> float:
        started = time.perf_counter()
        for _ in range(calls):
            unstacking.unstack_values([column], PUSH_ITEMS)
        return (time.perf_counter() - started) / calls * 1e6

    per: tuple[list[float], list[float]] = ([], [])
    try:
        for r in range(2 * rounds):
            on = r % 2 == 0
            unstacking.JOIN_ROW_BYTES = join_bytes if on else 1 << 62
            per[0 if on else 1].append(one_round())
    finally:
        unstacking.JOIN_ROW_BYTES = join_bytes
    ratios = [a / b for a, b in zip(*per, strict=True)]
    return statistics.median(per[0]), statistics.median(per[1]), statistics.median(ratios)


def _one_push(self: Any, op: Any) -> Any:
    return op


def main(argv: list[str] | None = None) -> None:
    """Measures each fast path's arm and prints one table."""
    parser = argparse.ArgumentParser(prog="python -m bench.fast_paths", description=__doc__)
    wrk_arguments(parser, duration=4.0)
    args = parse_wrk_arguments(parser, argv)
    if args is None:
        return
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        none = ("--durability", "none")
        for what, on, off, ratio in _server_pair(
            workdir, args, (*none, "--no-hot-routes"), (*none, "--hot-routes")
        ):
            rows.append([f"hot routes: {what} items/s", on, off, ratio])
        rows += _hand_over_pair(workdir, args)
        rows += _client_pairs(workdir, args)
        wal = ("--durability", "wal")
        for what, on, off, ratio in _server_pair(
            workdir, args, (*wal, "--wal-writer", "thread"), (*wal, "--wal-writer", "process")
        ):
            if what == "push":
                rows.append(["log writer process: push items/s (wal)", on, off, ratio])
        on_us, off_us, ratio = asyncio.run(_join_rounds(workdir, 2 * args.repeats, 400))
        rows.append(["writer joins queued pushes: loop CPU µs per item", on_us, off_us, ratio])
        on_us, off_us, ratio = _unstack_rounds(5 * args.repeats)
        rows.append(["columnar push values joined from slices: µs per push", on_us, off_us, ratio])
    print_table(
        f"Fast paths on and off: {args.repeats} pairs of {args.duration:g} s runs, medians "
        f"(wrk, 1 thread, {args.connections} connections; stream() prefetch 4, "
        f"{SAMPLE_ITEMS} x 4 KiB per batch)",
        ["fast path", "on", "off", "on / off"],
        rows,
    )


if __name__ == "__main__":
    main()
