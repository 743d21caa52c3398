"""Episodes: windows and n-step transitions sampled by one Python process, next to Reverb
and TorchRL serving the same steps.

The steps are Atari-sized: 84x84 uint8 frames with an int32 action and a float32 reward,
in episodes of 500 steps (:func:`bench.episodes_baselines.episode_frames`: flat background,
moving paddle and ball, a noisy strip, so that they compress about as real frames do).

* rlreplay: a live ``rlreplay serve --uds PATH`` (``--durability none``: Reverb keeps no
  log either) with an episode table per compression (``zstd`` and ``none``), filled through
  ``append_steps``; one ``ReplayClient("unix://PATH")`` in this process (the same-host
  transport, as Reverb's client reaches its server on the same host) samples windows of
  ``[64, 80]`` (``sample(t, 64, length=80, fields=["obs", "action"])``) and n-step
  transitions of ``[256]`` (``sample(t, 256, n_step=3, next_fields=["obs"])``), one call at
  a time and through ``stream(..., prefetch=4)``; then one call at a time over TCP on
  127.0.0.1 (the same server), and, for the transitions, a second server with the gathered
  build off (``GATHER_MAX_STEPS = 0``: each window built by itself), measured right after.
* Reverb 0.14 (its venv: ``RLREPLAY_REVERB_PYTHON``, else ``.venv-reverb``): its server and
  one client process, ``trajectory_writer`` items per window start and per transition,
  read through ``TrajectoryDataset`` batched by 64 and 256 (``bench.episodes_baselines``).
* TorchRL (in this interpreter if it imports torchrl, else ``RLREPLAY_TORCHRL_PYTHON`` or
  ``.venv-torchrl``): ``SliceSampler`` over a ``LazyTensorStorage`` in process, the ceiling of
  a local buffer, and a ``RandomSampler`` over stored n-step transitions.
* Where the time goes, for one rlreplay call at a time (Unix socket and TCP): the server's
  time per answer (its own request histogram, from ``/metrics``), the client's decode of an
  answer of the same size (msgpack to views, then the batch), and the rest (the wire and
  the client's HTTP).

Targets (issue 32): windows/s at least 3x Reverb's, and at least 0.5x TorchRL's in-process
rate. Run: ``python -m bench.episodes [--steps 20000] [--seconds 3] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from bench.episodes_baselines import (
    N_STEP,
    NSTEP_BATCH,
    WINDOW,
    WINDOW_BATCH,
    episodes,
    reverb_in,
    torchrl_in,
)
from bench.http import free_port, start_process, stop_process
from bench.report import print_table
from rlreplay.app.cli import serve_command
from rlreplay.clients import ReplayClient
from rlreplay.clients.columns import decode_views
from rlreplay.clients.windows import WindowBatch
from rlreplay.wire.codec import packb

ROOT = Path(__file__).resolve().parents[1]
MSGPACK = "application/msgpack"
WINDOWS = {"length": WINDOW, "fields": ["obs", "action"]}
NSTEP = {"n_step": N_STEP, "gamma": 0.99, "fields": ["obs", "action"], "next_fields": ["obs"]}
SAMPLE_ROUTE = 'route="/v1/tables/{table}/sample"'
#: The server with a module flag set first (an arm that is off), then its usual command line.
SERVER_WITH = """
import runpy, sys
import rlreplay.app.engine.windows as windows
{off}
sys.argv = ["rlreplay"] + sys.argv[1:]
runpy.run_module("rlreplay.app", run_name="__main__")
"""
#: Short windows (the transitions) built window by window, not gathered field by field.
NO_GATHER = "windows.GATHER_MAX_STEPS = 0"


async def fill(rb: ReplayClient, table: str, steps: int) -> float:
    """Appends the episodes, 100 steps a call, 4 episodes at a time; the seconds it took."""
    started = time.perf_counter()

    async def one(e: int, part: dict[str, Any]) -> None:
        length = len(part["obs"])
        for first in range(0, length, 100):
            chunk = {name: values[first : first + 100] for name, values in part.items()}
            last = first + 100 >= length
            await rb.append_steps(
                table, f"ep-{e}", chunk, start=first, end="terminated" if last else None
            )

    parts = list(enumerate(episodes(steps)))
    for group in range(0, len(parts), 4):
        await asyncio.gather(*(one(e, p) for e, p in parts[group : group + 4]))
    return time.perf_counter() - started


async def rate_for(seconds: float, fn: Callable[[], Awaitable[int]]) -> float:
    """Units per second of repeated ``await fn()`` over about ``seconds``, after a warm-up."""
    await fn()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        done += await fn()
    return done / (time.perf_counter() - started)


async def stream_rate(rb: ReplayClient, table: str, batch: int, seconds: float, **o: Any) -> float:
    """Windows/s of ``stream(..., prefetch=4)``, the first batch not counted."""
    done, started = 0, 0.0
    async for got in rb.stream(table, batch_size=batch, prefetch=4, **o):
        if not started:
            started = time.perf_counter()
            continue
        done += len(got)
        if time.perf_counter() - started > seconds:
            break
    return done / (time.perf_counter() - started)


def server_seconds(url: str) -> tuple[float, float]:
    """The sample route's summed seconds and count of answers, from ``/metrics``."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = count = 0.0
    for line in text.splitlines():
        if SAMPLE_ROUTE not in line or 'status="200"' not in line:
            continue
        value = float(line.rsplit(" ", 1)[1])
        if re.match(r"rlreplay_http_request_duration_seconds_sum\b", line):
            total += value
        elif re.match(r"rlreplay_http_request_duration_seconds_count\b", line):
            count += value
    return total, count


def decode_ms(url: str, table: str, body: dict[str, Any], repeats: int) -> tuple[float, int]:
    """Median milliseconds to decode one answer into a :class:`WindowBatch`, and its bytes."""
    answer = httpx.post(
        f"{url}/v1/tables/{table}/sample",
        content=packb(body),
        headers={"content-type": MSGPACK, "accept": MSGPACK},
        timeout=60,
    )
    answer.raise_for_status()
    raw = answer.content
    times = []
    for _ in range(repeats):
        buffer = bytearray(raw)  # the client reads into a buffer of its own, then views it
        t0 = time.perf_counter()
        WindowBatch.from_answer(decode_views(buffer))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, len(raw)


async def measure(
    url: str,
    metrics_url: str,
    table: str,
    seconds: float,
    repeats: int,
    kinds: tuple[str, ...] = ("windows", "transitions"),
    stream: bool = True,
) -> dict[str, Any]:
    """The rates of one table through ``url`` (the server's ``/metrics`` at
    ``metrics_url``), and where one call's time goes."""
    out: dict[str, Any] = {}
    async with ReplayClient(url) as rb:
        for kind in kinds:
            batch, options = (WINDOW_BATCH, WINDOWS) if kind == "windows" else (NSTEP_BATCH, NSTEP)

            async def call(batch: int = batch, options: dict[str, Any] = options) -> int:
                return len(await rb.sample(table, batch, **options))

            before = server_seconds(metrics_url)
            sequential = await rate_for(seconds, call)
            after = server_seconds(metrics_url)
            server_ms = (after[0] - before[0]) / max(after[1] - before[1], 1) * 1e3
            body = {"batch_size": batch, **options}
            decode, size = decode_ms(metrics_url, table, body, repeats)
            call_ms = batch / sequential * 1e3
            out[kind] = {
                "sequential": sequential,
                "call_ms": call_ms,
                "server_ms": server_ms,
                "decode_ms": decode,
                "rest_ms": call_ms - server_ms - decode,
                "mb": size / 1e6,
            }
            if stream:
                out[kind]["stream"] = await stream_rate(rb, table, batch, seconds, **options)
    return out


def start_server(tmp: Path, name: str, off: str | None = None) -> tuple[Any, str, str]:
    """``rlreplay serve`` on 127.0.0.1 and a Unix socket, with arm ``off`` off:
    (process, TCP URL, ``unix://`` URL)."""
    port = free_port()
    url, sock = f"http://127.0.0.1:{port}", tmp / f"{name}.sock"
    cmd = serve_command(port, tmp / name, "--durability", "none", "--uds", str(sock))
    if off is not None:  # the same flags, the module flag set first
        cmd = [sys.executable, "-c", SERVER_WITH.format(off=off), *cmd[3:]]
    return start_process(cmd, url, "/readyz", tmp / f"{name}.log"), url, f"unix://{sock}"


async def make_table(url: str, table: str, compression: str, steps: int) -> float:
    """Creates and fills an episode table; the seconds the fill took."""
    async with ReplayClient(url) as rb:
        await rb.create_table(
            table, sampler={"type": "uniform"}, episodes={"compression": compression}
        )
        return await fill(rb, table, steps)


async def rlreplay_rates(args: argparse.Namespace) -> dict[str, Any]:
    """Fills live servers' tables and measures them: compression -> figures."""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-episodes-") as tmp_name:
        tmp = Path(tmp_name)
        server, tcp, unix = start_server(tmp, "on")
        off_server, off_tcp, off_unix = start_server(tmp, "off", NO_GATHER)
        try:
            for compression in args.compressions:
                table = f"frames_{compression}"
                write_s = await make_table(unix, table, compression, args.steps)
                await make_table(off_unix, table, compression, args.steps)
                figures = await measure(unix, tcp, table, args.seconds, args.repeats)
                figures["tcp"] = await measure(
                    tcp, tcp, table, args.seconds, args.repeats, stream=False
                )
                figures["no_gather"] = await measure(
                    off_unix, off_tcp, table, args.seconds, args.repeats, ("transitions",), False
                )
                async with ReplayClient(unix) as rb:
                    # read after sampling: chunks are compressed as they are sealed
                    stats = (await rb.describe_table(table)).get("stats", {})
                figures["write_s"] = write_s
                figures["stored_mb"] = float(stats.get("stored_bytes", 0)) / 1e6
                results[compression] = figures
        finally:
            stop_process(server)
            stop_process(off_server)
    return results


def baseline_python(variable: str, venv: str) -> str | None:
    """The interpreter named by ``variable``, else ``venv``'s, if it exists."""
    named = os.environ.get(variable)
    python = Path(named) if named else ROOT / venv / "bin/python"
    return str(python) if python.exists() else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.episodes", description=__doc__)
    parser.add_argument("--steps", type=int, default=20_000, help="steps stored (all arms)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per rate")
    parser.add_argument("--repeats", type=int, default=5, help="decodes timed per size")
    parser.add_argument("--quick", action="store_true", help="5,000 steps, 1 s, zstd only")
    args = parser.parse_args(argv)
    args.compressions = ["zstd", "none"]
    if args.quick:
        args.steps, args.seconds, args.compressions = 5_000, 1.0, ["zstd"]
    ours = asyncio.run(rlreplay_rates(args))
    reverb_python = baseline_python("RLREPLAY_REVERB_PYTHON", ".venv-reverb")
    reverb = (
        reverb_in(reverb_python, args.steps, args.seconds)
        if reverb_python
        else {"error": "no Reverb venv (make .venv-reverb/bin/python)"}
    )
    torchrl_python = baseline_python("RLREPLAY_TORCHRL_PYTHON", ".venv-torchrl")
    torchrl = torchrl_in(torchrl_python, args.steps, args.seconds)
    report(args, ours, reverb, torchrl)


def report(
    args: argparse.Namespace,
    ours: dict[str, Any],
    reverb: dict[str, Any],
    torchrl: dict[str, Any],
) -> None:
    """The rates next to each other, the ratios, and where one call's time goes."""

    def theirs(arm: dict[str, Any], kind: str) -> Any:
        return arm.get(kind, arm.get("error", "-"))

    rows: list[list[Any]] = []

    def row(label: str, rate: float, kind: str) -> list[Any]:
        return [label, rate, _ratio(rate, reverb.get(kind)), _ratio(rate, torchrl.get(kind))]

    for compression, figures in ours.items():
        for kind in ("windows", "transitions"):
            for how in ("sequential", "stream"):
                label = f"rlreplay {kind}, {how}, Unix socket ({compression})"
                rows.append(row(label, figures[kind][how], kind))
        for kind in ("windows", "transitions"):
            label = f"rlreplay {kind}, sequential, TCP 127.0.0.1 ({compression})"
            rows.append(row(label, figures["tcp"][kind]["sequential"], kind))
        label = f"rlreplay transitions, sequential, Unix socket, gather off ({compression})"
        rows.append(row(label, figures["no_gather"]["transitions"]["sequential"], "transitions"))
    for name, arm in (("Reverb", reverb), ("TorchRL", torchrl)):
        for kind in ("windows", "transitions"):
            label = f"{name} {kind} ({arm.get('version', '-')})"
            rows.append([label, theirs(arm, kind), "-", "-"])
    print_table(
        f"Windows of [{WINDOW_BATCH}, {WINDOW}] and {N_STEP}-step transitions of "
        f"[{NSTEP_BATCH}], 84x84 uint8 frames, {args.steps:,} steps; one Python process "
        f"samples, {args.seconds:g} s per figure (targets: 3x Reverb, 0.5x TorchRL)",
        ["arm", "windows or transitions /s", "/ Reverb", "/ TorchRL in process"],
        rows,
    )
    breakdown = []
    for compression, figures in ours.items():
        for transport, part in (
            ("Unix socket", figures),
            ("TCP", figures["tcp"]),
            ("Unix socket, gather off", figures["no_gather"]),
        ):
            for kind in ("windows", "transitions"):
                if kind not in part:
                    continue
                f = part[kind]
                breakdown.append(
                    [
                        f"{kind}, {transport} ({compression})",
                        f["mb"],
                        f["call_ms"],
                        f["server_ms"],
                        f["decode_ms"],
                        f["rest_ms"],
                    ]
                )
    print_table(
        "Where one rlreplay call's time goes (ms): the server's answer (its request "
        "histogram), the client's decode, the rest (wire and the client's HTTP)",
        ["answer", "MB", "call", "server", "client decode", "wire + rest"],
        breakdown,
    )
    stored = [
        [
            f"rlreplay ({compression})",
            figures["stored_mb"],
            figures["write_s"],
        ]
        for compression, figures in ours.items()
    ]
    stored.append(["Reverb (trajectory_writer)", "-", reverb.get("write_s", "-")])
    print_table(
        f"Filling {args.steps:,} steps ({args.steps * 84 * 84 / 1e6:.0f} MB of frames raw)",
        ["arm", "stored MB", "write s"],
        stored,
    )


def _ratio(ours: float, theirs: Any) -> Any:
    if not isinstance(theirs, int | float) or not theirs:
        return "-"
    return f"{ours / theirs:.2f}x"


if __name__ == "__main__":
    main()
