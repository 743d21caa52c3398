"""Sustained ingest: what checkpoints cost a writer that never stops.

One server at a time (``hybrid``, ``wal``), fed for ``--duration`` seconds (60 by default) by

* the pipelined writer: one Python process, ``ReplayClient.writer(max_in_flight=8)``,
  64 items of 4 KiB per push, every key new, into a table capped at 200,000 items (FIFO);
* ``wrk`` (when installed): 1 thread, ``--connections`` keep-alive connections, new-key
  pushes of the same shape into the same kind of table.

Each arm runs against the default settings (a checkpoint when recovery would take longer
than its bound, at the latest every 1024 MB of log) and against the same server with
checkpoints pushed past the run (``--wal-checkpoint-mb 100000 --recovery-bound-s 0``); the
pipelined writer also runs against Reverb 0.14's writer (same values, same table) when its
venv is there (``RLREPLAY_REVERB_PYTHON``, else ``.venv-reverb``).

While the load runs, a thread of this process asks ``/healthz`` every 10 ms: its p99 and
its longest answer show how long the server's event loop stalled (every route waits
behind a stall). The server's own figures come from ``/metrics`` at the end: checkpoints
taken, the longest event-loop stall during one, the longest checkpoint; a thread reading
``/metrics`` every 250 ms also keeps each checkpoint's longest stall
(``stall_per_checkpoint_ms`` in the arm's line). Then the server is
killed (``kill -9``) and started again on the same data: the seconds until it is ready
are the recovery time, next to the bound the server states. Each arm's line also gives the
CPU seconds the server's threads took during the load, by name (Linux): ``loop`` (the event
loop's thread), ``python`` (its other threads: I/O, the watchdog), ``rocksdb:low``
(compactions), ``rocksdb:high`` (flushes), ``child:python`` (the log writer process).

Run: ``python -m bench.ingest [--duration 60] [--repeats 1] [--arms writer,wrk,reverb]
[--servers default,"no checkpoints"] [--quick] [--log-loop-stalls-ms 50 --server-logs DIR]
[--server-flags "--storage-mode memory"]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.client import reverb_python
from bench.http import _push_template, _wrk, free_port
from bench.report import print_table
from rlreplay.app.cli import serve_command

TABLE = "bench"
CAPACITY = 200_000
PUSH_ITEMS = 64
ITEM_BYTES = 4096
NO_CHECKPOINTS = ("--wal-checkpoint-mb", "100000", "--recovery-bound-s", "0")
_READY_WITHIN_S = 900  # a start's recovery may replay gigabytes of log
#: A server whose checkpoints are pushed past the run has 12 to 15 GB of log after 60 s of
#: `wrk`; a restart reads it twice (checks, then applies) and that is not the figure this
#: bench is for: past this much log, the restart is not timed.
RESTART_LOG_MB_MAX = 4096
#: The servers each load runs against: label -> flags.
SERVERS: dict[str, tuple[str, ...]] = {"default": (), "no checkpoints": NO_CHECKPOINTS}

#: The pipelined writer, in a process of its own: URL SECONDS -> JSON (items/s, per second).
_WRITER = """
import asyncio, json, sys, time
import numpy as np
from rlreplay.clients import ReplayClient

async def main(url, seconds):
    arr = np.random.default_rng(0).integers(0, 256, (%d, %d), dtype=np.uint8)
    done, per_second, counter = 0, [], 0
    async with ReplayClient(url) as rb:
        started = time.perf_counter()
        mark, at_mark = started + 1, 0
        async with rb.writer("%s", max_in_flight=8, batch_items=%d) as w:
            while (now := time.perf_counter()) < started + seconds:
                counter += 1
                for i in range(len(arr)):
                    await w.append(f"{counter:010d}/{i}", {"x": arr[i]})
                done += len(arr)
                if now >= mark:
                    per_second.append(done - at_mark)
                    mark, at_mark = mark + 1, done
        rate = done / (time.perf_counter() - started)
    print(json.dumps({"rate": rate, "per_second": per_second}))

asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""

_WRITER_ARGS = (PUSH_ITEMS, ITEM_BYTES, TABLE, PUSH_ITEMS)

#: Reverb's server and writer in one script: SECONDS -> JSON (items/s).
_REVERB = """
import json, sys, time
import numpy as np, reverb
seconds = float(sys.argv[1])
table = reverb.Table(name="bench", sampler=reverb.selectors.Uniform(),
                     remover=reverb.selectors.Fifo(), max_size=%d,
                     rate_limiter=reverb.rate_limiters.MinSize(1))
server = reverb.Server(tables=[table], port=None)
client = reverb.Client(f"localhost:{server.port}")
arr = np.random.default_rng(0).integers(0, 256, (%d, %d), dtype=np.uint8)
done, started = 0, time.perf_counter()
with client.trajectory_writer(num_keep_alive_refs=1) as w:
    while time.perf_counter() < started + seconds:
        for row in arr:
            w.append({"x": row})
            w.create_item("bench", 1.0, {"x": w.history["x"][-1]})
        w.flush(block_until_num_items=8 * len(arr))
        done += len(arr)
    w.flush()
print(json.dumps({"rate": done / (time.perf_counter() - started)}))
server.stop()
"""
_REVERB_ARGS = (CAPACITY, PUSH_ITEMS, ITEM_BYTES)


@contextlib.contextmanager
def polling(*polls: Callable[[threading.Event], None]) -> Iterator[None]:
    """Each of ``polls`` in a daemon thread of its own for the ``with`` block's length."""
    stop = threading.Event()
    threads = [threading.Thread(target=poll, args=(stop,), daemon=True) for poll in polls]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join()


class HealthProbe:
    """A thread asking ``/healthz`` every 10 ms, keeping each answer's latency."""

    def __init__(self, url: str) -> None:
        self._url = url
        self.latencies: list[float] = []

    def run(self, stop: threading.Event) -> None:
        """Ask until ``stop`` is set (in a thread: see :func:`polling`)."""
        with httpx.Client(base_url=self._url, timeout=30) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    c.get("/healthz")
                except httpx.HTTPError:
                    continue
                self.latencies.append(time.perf_counter() - t0)
                stop.wait(0.01)

    def figures(self) -> tuple[float, float]:
        """p99 and the longest latency, in ms."""
        if len(self.latencies) < 2:
            return 0.0, 0.0
        cuts = statistics.quantiles(self.latencies, n=100, method="inclusive")
        return cuts[98] * 1e3, max(self.latencies) * 1e3


class CheckpointWatch:
    """A thread reading ``/metrics`` every 250 ms: each checkpoint's longest event-loop
    stall (``rlreplay_checkpoint_loop_stall_last_seconds`` when the count moved on; two
    checkpoints within one look give the later one's)."""

    def __init__(self, url: str) -> None:
        self._url = url
        #: (checkpoints so far, the last one's stall in ms, its seconds)
        self.seen: list[tuple[int, float, float]] = []

    def run(self, stop: threading.Event) -> None:
        """Read until ``stop`` is set (in a thread: see :func:`polling`)."""
        count = 0
        with httpx.Client(base_url=self._url, timeout=30) as c:
            while not stop.wait(0.25):
                try:
                    text = c.get("/metrics").text
                except httpx.HTTPError:
                    continue
                now = int(_metric(text, "rlreplay_checkpoints_total"))
                if now != count:
                    count = now
                    stall = _metric(text, "rlreplay_checkpoint_loop_stall_last_seconds")
                    seconds = _metric(text, "rlreplay_checkpoint_last_seconds")
                    self.seen.append((now, round(stall * 1e3, 1), round(seconds, 2)))


def _start(data_dir: Path, log: Path, port: int, flags: tuple[str, ...]) -> subprocess.Popen[bytes]:
    """A server, once ready: a restart replays the whole log first (minutes, without
    checkpoints), so it gets far longer than :func:`bench.http.start_process` waits."""
    cmd = serve_command(port, data_dir, "--log-level", "warning", *flags)
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + _READY_WITHIN_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the server on port {port} was not ready in {_READY_WITHIN_S} s")


def thread_cpu(pid: int) -> dict[tuple[int, int], tuple[str, float]]:
    """CPU seconds so far of each thread of process ``pid`` and of its children (Linux's
    ``/proc``; empty elsewhere): (process, thread) -> (name, seconds). The main thread
    of ``pid`` is named ``loop`` (the event loop's), a child's threads ``child:<name>``."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = entry.read_text()
        except OSError:  # the process ended meanwhile
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            pids.append(int(entry.parent.name))
    out: dict[tuple[int, int], tuple[str, float]] = {}
    for p in pids:
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            tid = int(task.name)
            if p != pid:
                name = f"child:{name}"
            elif tid == pid:
                name = "loop"
            out[(p, tid)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_by_name(
    before: dict[tuple[int, int], tuple[str, float]],
    after: dict[tuple[int, int], tuple[str, float]],
) -> dict[str, float]:
    """CPU seconds between two :func:`thread_cpu` readings, summed by thread name."""
    spent: dict[str, float] = {}
    for key, (name, seconds) in after.items():
        was = before.get(key, (name, 0.0))[1]
        spent[name] = round(spent.get(name, 0.0) + seconds - was, 2)
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


def _metric(text: str, name: str) -> float:
    """The value of an unlabelled series ``name`` in a /metrics scrape (0 if absent)."""
    found = re.search(rf"^{re.escape(name)} ([-+0-9.e]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def run_arm(
    arm: str, flags: tuple[str, ...], args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """One server, one load, then kill -9 and a restart: the arm's figures."""
    data_dir = workdir / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = workdir / "server.log"
    flags = (*flags, *args.server_flags.split())
    if args.log_loop_stalls_ms:
        flags = (*flags, "--log-loop-stalls-ms", str(args.log_loop_stalls_ms))
    proc = _start(data_dir, log, port, flags)
    figures: dict[str, Any] = {}
    try:
        httpx.put(
            f"{url}/v1/tables/{TABLE}",
            json={"max_size": CAPACITY, "remover": {"type": "fifo"}},
            timeout=30,
        ).raise_for_status()
        cpu_before = thread_cpu(proc.pid)
        probe, watch = HealthProbe(url), CheckpointWatch(url)
        with polling(probe.run, watch.run):
            if arm == "writer":
                out = subprocess.run(
                    [sys.executable, "-c", _WRITER % _WRITER_ARGS, url, str(args.duration)],
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=args.duration + 120,
                ).stdout
                result = json.loads(out)
                figures["rate"] = result["rate"]
                figures["per_second"] = result["per_second"]
            else:
                body = _push_template()
                rate, bad = _wrk(
                    url + f"/v1/tables/{TABLE}/items",
                    [body],
                    duration=args.duration,
                    connections=args.connections,
                    workdir=workdir,
                )
                figures["rate"] = rate * PUSH_ITEMS
                figures["refused"] = bad
        figures["cpu_s"] = cpu_by_name(cpu_before, thread_cpu(proc.pid))
        figures["stall_per_checkpoint_ms"] = [stall for _, stall, _ in watch.seen]
        figures["healthz_p99"], figures["healthz_max"] = probe.figures()
        scrape = httpx.get(f"{url}/metrics", timeout=30).text
        figures["checkpoints"] = _metric(scrape, "rlreplay_checkpoints_total")
        figures["stall_ms"] = _metric(scrape, "rlreplay_checkpoint_loop_stall_max_seconds") * 1e3
        figures["ckpt_s"] = _metric(scrape, "rlreplay_checkpoint_duration_max_seconds")
        figures["bound_s"] = _metric(scrape, "rlreplay_recovery_bound_seconds")
        figures["log_mb"] = _metric(scrape, "rlreplay_wal_bytes") / 2**20
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    if args.server_logs is not None:  # the loaded run's log (stall warnings, with stacks)
        args.server_logs.mkdir(parents=True, exist_ok=True)
        runs = len(list(args.server_logs.glob(f"{arm}-*.log")))
        shutil.copy(log, args.server_logs / f"{arm}-{runs:02d}-{'-'.join(flags) or 'default'}.log")
    figures["recovery_s"] = float("nan")
    figures["replay_mb_s"] = float("nan")
    if figures["log_mb"] > RESTART_LOG_MB_MAX:
        return figures
    started = time.monotonic()
    proc = _start(data_dir, workdir / "restart.log", port, flags)
    figures["recovery_s"] = time.monotonic() - started
    scrape = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    figures["replay_mb_s"] = _metric(scrape, "rlreplay_recovery_replay_bytes_per_second") / 2**20
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load per run")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each arm, back to back")
    parser.add_argument("--connections", type=int, default=8, help="wrk's connections")
    parser.add_argument("--arms", default="writer,wrk,reverb", help="which loads to run")
    parser.add_argument(
        "--servers", default="default,no checkpoints", help="which server settings to run"
    )
    parser.add_argument("--quick", action="store_true", help="15 s runs")
    parser.add_argument(
        "--server-flags",
        default="",
        help='more flags for every server, e.g. "--storage-mode memory"',
    )
    parser.add_argument(
        "--log-loop-stalls-ms",
        type=float,
        default=0,
        help="servers log the stack of event-loop stalls past this (see --server-logs)",
    )
    parser.add_argument(
        "--server-logs", type=Path, default=None, help="keep each loaded server's log here"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.duration = min(args.duration, 15.0)
    arms = args.arms.split(",")
    if "wrk" in arms and shutil.which("wrk") is None:
        print("\npython -m bench.ingest: no wrk on PATH (apt-get install wrk): its arm is left out")
        arms.remove("wrk")
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory(prefix="rlreplay-ingest-") as tmp:
        workdir = Path(tmp)
        for arm in [a for a in arms if a != "reverb"]:
            for _ in range(args.repeats):
                for label, flags in SERVERS.items():
                    if label not in args.servers.split(","):
                        continue
                    f = run_arm(arm, flags, args, workdir)
                    print(f"# {arm} {label}: {json.dumps(f)}", flush=True)
                    rows.append(
                        [
                            arm,
                            label,
                            f"{f['rate'] / 1e3:.1f}k",
                            int(f["checkpoints"]),
                            f"{f['stall_ms']:.1f}",
                            f"{f['healthz_p99']:.1f}",
                            f"{f['healthz_max']:.1f}",
                            "-" if f["recovery_s"] != f["recovery_s"] else f"{f['recovery_s']:.1f}",
                            f"{f['bound_s']:.0f}",
                        ]
                    )
        if "reverb" in arms:
            python = reverb_python()
            if python is None or subprocess.run([str(python), "-c", "import reverb"]).returncode:
                print("\npython -m bench.ingest: no Reverb venv (make .venv-reverb/bin/python)")
            else:
                for _ in range(args.repeats):
                    out = subprocess.run(
                        [str(python), "-c", _REVERB % _REVERB_ARGS, str(args.duration)],
                        capture_output=True,
                        text=True,
                        check=True,
                        timeout=args.duration + 300,
                    ).stdout
                    rate = json.loads(out.strip().splitlines()[-1])["rate"]
                    rows.append(["reverb writer", "no log", f"{rate / 1e3:.1f}k", *[""] * 6])
    print_table(
        f"sustained ingest, {args.duration:g} s per run, new keys into a table capped at "
        f"{CAPACITY:,} (fifo), hybrid + wal",
        [
            "load",
            "checkpoints",
            "items/s",
            "taken",
            "longest stall in one (ms)",
            "/healthz p99 (ms)",
            "/healthz max (ms)",
            "recovery after kill -9 (s)",
            "recovery bound (s)",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
