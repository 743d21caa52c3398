"""One Python client process against a live ``rlreplay serve``, next to wrk on the same bytes.

Values are ``{"x": <4 KiB uint8 array>}``; pushes carry 64 items, samples 256. The server is
hybrid, ``--durability wal``, its table capped at 50,000 items with the ``fifo`` remover and
prefilled with 4096 items; every push (the client's and wrk's) has new keys, so once the
table is full each push also evicts 64 items.

* codec: microseconds per array to encode and decode a push of 64 arrays in process
  (:func:`rlreplay.wire.codec.packb` / ``unpackb``), next to msgpack-python on the same
  bytes as plain ``bytes`` values, and a plain copy of 4 KiB out of a ``memoryview``.
* client: items/s of one ``ReplayClient`` in a process of its own (so that it has its own
  share of the cores): ``push`` (sequential), ``writer(max_in_flight=8)``, ``push_columns``
  (sequential, and 4 in flight through ``asyncio.gather``), ``stream()`` per item and with
  ``layout="columns"``. Each client run is paired with a wrk run of the very bytes that
  client call sends (wrk writes new keys into them), the two back to back; the ratio is the
  median of the pairs' ratios client / wrk. The pipelined pushes run against a second
  server with ``--durability none`` too: Reverb keeps no log either.
* latency: one producer, one ``push_columns`` of 64 x 4 KiB at a time, with
  ``--durability wal`` and ``none`` (two servers, one after the other), next to a bare
  ``os.write`` + ``os.fdatasync`` of the same 256 KiB to a file on the data dir's filesystem.
* Reverb 0.14 (when its venv is there: ``RLREPLAY_REVERB_PYTHON``, else ``.venv-reverb``;
  it pins TensorFlow 2.15, hence a venv of its own): its server and its Python client, each
  in a process of its own, the same table shape; pushes through ``trajectory_writer``,
  samples through ``TrajectoryDataset`` batched by 256. A last table divides each client
  figure of this run by Reverb's (pushes by its faster, 512-in-flight writer).

Run: ``python -m bench.client [--duration 3] [--repeats 3] [--connections 4] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence, Sized
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np

from bench.http import KEY_MARK, _wrk, free_port, start_process, stop_process
from bench.report import print_table
from rlreplay.app.cli import serve_command
from rlreplay.clients.bodies import columns_request, encode_body, push_request
from rlreplay.wire.codec import packb, unpackb
from rlreplay.wire.schemas import DEFAULT_TIMEOUT_MS, SampleRequest

ITEM_BYTES = 4096
PUSH_ITEMS = 64
SAMPLE_ITEMS = 256
PRELOAD = 4096
TABLE = "bench"
CAPACITY = 50_000
#: Key numbers of the client's pushes start here, far from wrk's (``_wrk_runs * 10**7``).
CLIENT_KEY_BASE = 9 * 10**9
#: Pushes a latency run makes at most (each bounded in time as well).
LATENCY_PUSHES = 2000


def _columns(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 256, (PUSH_ITEMS, ITEM_BYTES), dtype=np.uint8)


def _keys(prefix: str) -> list[str]:
    """The keys of one push: ``prefix`` is 10 characters (a number or :data:`KEY_MARK`)."""
    return [f"{prefix}/{i}" for i in range(PUSH_ITEMS)]


def _items(keys: list[str], arr: np.ndarray) -> list[dict[str, Any]]:
    return [{"key": k, "value": {"x": arr[i]}} for i, k in enumerate(keys)]


# --- the codec, in process -----------------------------------------------------------------


def _us_per_call(fn: Callable[[], object], *, seconds: float, repeats: int = 5) -> float:
    """Median over ``repeats`` of µs per ``fn()`` call, each repeat ``seconds / repeats`` long
    (and at most 100,000 calls)."""
    per: list[float] = []
    for _ in range(repeats):
        calls, started = 0, time.perf_counter()
        deadline = started + seconds / repeats
        while calls < 100_000:
            fn()
            calls += 1
            if time.perf_counter() > deadline:
                break
        per.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(per)


def codec_rows(seconds: float) -> list[list[object]]:
    """µs per array to encode and decode a push of 64 arrays, by route."""
    arr = _columns(np.random.default_rng(0))
    keys = _keys(f"{0:010d}")
    arrays = {
        "items": [{"key": k, "value": {"x": arr[i]}, "priority": 1.0} for i, k in enumerate(keys)]
    }
    as_bytes = {
        "items": [
            {"key": k, "value": {"x": arr[i].tobytes()}, "priority": 1.0}
            for i, k in enumerate(keys)
        ]
    }
    items = _items(keys, arr)
    packed = packb(arrays)
    packed_bytes = msgpack.packb(as_bytes)
    # a body may come as pieces (wire/pieces.py): decoding reads the joined bytes
    push_body = bytes(encode_body(push_request(items, False)))
    columns_body = bytes(encode_body(columns_request(keys, {"x": arr}, None, False)))
    per = PUSH_ITEMS

    def each(fn: Callable[[], object]) -> float:
        return _us_per_call(fn, seconds=seconds) / per

    view = memoryview(arr[0])
    rows: list[list[object]] = [
        [
            "codec packb / unpackb, {'x': ndarray} x 64",
            each(lambda: packb(arrays)),
            each(lambda: unpackb(packed)),
            len(packed),
        ],
        [
            "msgpack packb / unpackb, {'x': bytes} x 64 (baseline)",
            each(lambda: msgpack.packb(as_bytes)),
            each(lambda: msgpack.unpackb(packed_bytes)),
            len(packed_bytes),
        ],
        [
            "client push body: encode_body(push_request) / unpackb",
            each(lambda: encode_body(push_request(items, False))),
            each(lambda: unpackb(push_body)),
            len(push_body),
        ],
        [
            "client columns body: encode_body(columns_request) / unpackb",
            each(lambda: encode_body(columns_request(keys, {"x": arr}, None, False))),
            each(lambda: unpackb(columns_body)),
            len(columns_body),
        ],
        [
            "bytes(memoryview) of 4 KiB (a copy)",
            _us_per_call(lambda: bytes(view), seconds=seconds),
            "",
            ITEM_BYTES,
        ],
    ]
    return rows


# --- one client process --------------------------------------------------------------------


async def _run_worker(mode: str, url: str, seconds: float, base: int) -> dict[str, float]:
    from rlreplay.clients import ReplayClient

    arr = _columns(np.random.default_rng(base))
    counter = base

    def next_keys() -> list[str]:
        nonlocal counter
        counter += 1
        return _keys(f"{counter:010d}")

    async with ReplayClient(url) as rb:
        done, started = 0, time.perf_counter()
        deadline = started + seconds
        if mode == "push":
            while time.perf_counter() < deadline:
                done += await rb.push(TABLE, _items(next_keys(), arr))
        elif mode == "writer":
            async with rb.writer(TABLE, max_in_flight=8, batch_items=PUSH_ITEMS) as w:
                while time.perf_counter() < deadline:
                    for i, key in enumerate(next_keys()):
                        await w.append(key, {"x": arr[i]})
                    done += PUSH_ITEMS
        elif mode == "columns":
            while time.perf_counter() < deadline:
                done += await rb.push_columns(TABLE, next_keys(), {"x": arr})
        elif mode == "columns4":
            while time.perf_counter() < deadline:
                counts = await asyncio.gather(
                    *(rb.push_columns(TABLE, next_keys(), {"x": arr}) for _ in range(4))
                )
                done += sum(counts)
        elif mode == "stream":
            done = await _drain(rb.stream(TABLE, batch_size=SAMPLE_ITEMS, prefetch=4), deadline)
        elif mode == "stream_columns":
            batches = rb.stream(TABLE, batch_size=SAMPLE_ITEMS, prefetch=4, layout="columns")
            done = await _drain(batches, deadline)
        elif mode in ("latency", "latency_wait"):
            waits: list[float] = []
            while len(waits) < LATENCY_PUSHES and time.perf_counter() < deadline:
                keys = next_keys()
                t0 = time.perf_counter()
                await rb.push_columns(TABLE, keys, {"x": arr}, wait=mode == "latency_wait")
                waits.append(time.perf_counter() - t0)
            return _percentiles(waits)
        else:
            raise ValueError(f"unknown worker mode {mode!r}")
        return {"rate": done / (time.perf_counter() - started)}


async def _drain(batches: AsyncIterator[Sized], deadline: float) -> int:
    """Items taken from ``batches`` until ``deadline``; then the stream is closed."""
    done = 0
    try:
        async for batch in batches:
            done += len(batch)
            if time.perf_counter() > deadline:
                break
    finally:
        close = getattr(batches, "aclose", None)
        if close is not None:
            await close()
    return done


def _percentiles(seconds: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(seconds, n=100, method="inclusive")
    return {"p50": cuts[49] * 1e3, "p99": cuts[98] * 1e3, "n": float(len(seconds))}


def worker() -> None:
    """``python -c 'from bench.client import worker; worker()' MODE URL SECONDS BASE``:
    one client's figures as JSON on stdout."""
    from rlreplay.clients import tune_malloc

    tune_malloc()  # a trainer taking 1 MB batches opts in (the client never does it itself)
    mode, url, seconds, base = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(asyncio.run(_run_worker(mode, url, seconds, base))))


_worker_runs = 0


def _client_run(mode: str, url: str, seconds: float) -> dict[str, float]:
    global _worker_runs
    _worker_runs += 1
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from bench.client import worker; worker()",
            mode,
            url,
            str(seconds),
            str(CLIENT_KEY_BASE + _worker_runs * 10**7),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def _wrk_bodies(rng: np.random.Generator) -> dict[str, list[bytes]]:
    """The bodies the client sends, for wrk: push keys are :data:`KEY_MARK` (made new per
    request), so wrk sends what the client does, byte for byte but for the key numbers."""
    arr = _columns(rng)
    keys = _keys(KEY_MARK.decode())
    pushes = bytes(encode_body(push_request(_items(keys, arr), False)))
    columns = bytes(encode_body(columns_request(keys, {"x": arr}, None, False)))
    assert pushes.count(KEY_MARK) == PUSH_ITEMS and columns.count(KEY_MARK) == PUSH_ITEMS

    def sample(layout: str) -> bytes:
        request = SampleRequest(SAMPLE_ITEMS, DEFAULT_TIMEOUT_MS, True, layout)  # type: ignore[arg-type]
        return bytes(encode_body(request))

    return {
        "push": [pushes],
        "columns": [columns],
        "sample": [sample("items")],
        "sample_columns": [sample("columns")],
    }


#: Client mode -> (wrk body set, path, items per wrk request).
_PAIRS: dict[str, tuple[str, str, int]] = {
    "push": ("push", "/items", PUSH_ITEMS),
    "writer": ("push", "/items", PUSH_ITEMS),
    "columns": ("columns", "/items", PUSH_ITEMS),
    "columns4": ("columns", "/items", PUSH_ITEMS),
    "stream": ("sample", "/sample", SAMPLE_ITEMS),
    "stream_columns": ("sample_columns", "/sample", SAMPLE_ITEMS),
}
_LABELS = {
    "push": "push(64 items), sequential",
    "writer": "writer(max_in_flight=8), append per item",
    "columns": "push_columns(64), sequential",
    "columns4": "push_columns(64), gather of 4",
    "stream": "stream(256, prefetch=4), items",
    "stream_columns": 'stream(256, prefetch=4), layout="columns"',
}


def client_rows(
    url: str,
    args: argparse.Namespace,
    workdir: Path,
    has_wrk: bool,
    modes: Sequence[str] = tuple(_PAIRS),
    label: str = "",
) -> list[list[object]]:
    """Per client mode: its items/s, wrk's on the same bytes, the ratio (medians of pairs)."""
    bodies = _wrk_bodies(np.random.default_rng(1))
    rows: list[list[object]] = []
    for mode in modes:
        body_set, path, items = _PAIRS[mode]
        rates, wrk_rates, ratios = [], [], []
        for i in range(args.repeats):
            order = ("client", "wrk") if i % 2 == 0 else ("wrk", "client")
            pair: dict[str, float] = {}
            for which in order:
                if which == "client":
                    pair["client"] = _client_run(mode, url, args.duration)["rate"]
                elif has_wrk:
                    rate, _bad = _wrk(
                        f"{url}/v1/tables/{TABLE}{path}",
                        bodies[body_set],
                        duration=args.duration,
                        connections=args.connections,
                        workdir=workdir,
                    )
                    pair["wrk"] = rate * items
            rates.append(pair["client"])
            if has_wrk:
                wrk_rates.append(pair["wrk"])
                ratios.append(pair["client"] / pair["wrk"])
        row: list[object] = [_LABELS[mode] + label, statistics.median(rates)]
        if has_wrk:
            row += [statistics.median(wrk_rates), statistics.median(ratios)]
        else:
            row += ["skipped", "skipped"]
        rows.append(row)
    return rows


# --- latency -------------------------------------------------------------------------------


def fsync_row(data_dir: Path, seconds: float) -> list[object]:
    """p50/p99 of ``os.write`` + ``os.fdatasync`` of 256 KiB appended to a file in ``data_dir``."""
    block = os.urandom(PUSH_ITEMS * ITEM_BYTES)
    path = data_dir / "fsync-probe.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    waits: list[float] = []
    try:
        deadline = time.perf_counter() + seconds
        while len(waits) < LATENCY_PUSHES and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            waits.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    figures = _percentiles(waits)
    return ["os.write + os.fdatasync, 256 KiB", figures["p50"], figures["p99"], len(waits)]


def latency_rows(url: str, durability: str, seconds: float) -> list[list[object]]:
    rows: list[list[object]] = []
    for mode, label in (("latency", "wait=False"), ("latency_wait", "wait=True")):
        figures = _client_run(mode, url, seconds)
        rows.append(
            [
                f"push_columns(64 x 4 KiB), {label}, durability {durability}",
                figures["p50"],
                figures["p99"],
                int(figures["n"]),
            ]
        )
    return rows


# --- Reverb, in a venv of its own ----------------------------------------------------------

#: Reverb's server, in a process of its own: prints its port, serves until stdin closes.
_REVERB_SERVER = """
import sys, reverb
table = reverb.Table(name="bench", sampler=reverb.selectors.Uniform(),
                     remover=reverb.selectors.Fifo(), max_size=%d,
                     rate_limiter=reverb.rate_limiters.MinSize(1))
server = reverb.Server(tables=[table], port=None)
print(server.port, flush=True)
sys.stdin.read()
server.stop()
"""

#: Reverb's Python client: MODE PORT SECONDS -> JSON (items/s, or latency ms).
_REVERB_CLIENT = """
import json, statistics, sys, time
import numpy as np, reverb
mode, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
client = reverb.Client(f"localhost:{port}")
arr = np.random.default_rng(0).integers(0, 256, (%d, %d), dtype=np.uint8)
done, waits, started = 0, [], time.perf_counter()
deadline = started + seconds
if mode == "sample":
    # client.sample() keeps one item in flight (~55 items/s here; its docstring says it is
    # not for training): the recommended reader is the dataset
    import tensorflow as tf
    dataset = reverb.TrajectoryDataset(
        f"localhost:{port}", "bench", dtypes={"x": tf.uint8},
        shapes={"x": tf.TensorShape([%d])}, max_in_flight_samples_per_worker=2 * %d,
    ).batch(%d)
    first = True
    for batch in dataset:
        if first:  # the first batch (the pipeline built and traced) is not counted
            first, started = False, time.perf_counter()
            deadline = started + seconds
            continue
        done += int(batch.data["x"].shape[0])
        if time.perf_counter() > deadline or done > 10**8:
            break
else:
    with client.trajectory_writer(num_keep_alive_refs=1) as w:
        while time.perf_counter() < deadline and len(waits) < %d:
            t0 = time.perf_counter()
            for row in arr:
                w.append({"x": row})
                w.create_item("bench", 1.0, {"x": w.history["x"][-1]})
            if mode == "push":
                w.flush()
            else:
                w.flush(block_until_num_items=8 * len(arr))
            waits.append(time.perf_counter() - t0)
            done += len(arr)
        w.flush()
rate = done / (time.perf_counter() - started)
cuts = statistics.quantiles(waits, n=100, method="inclusive") if len(waits) > 1 else [0.0] * 99
print(json.dumps({"rate": rate, "p50": cuts[49] * 1e3, "p99": cuts[98] * 1e3}))
"""


def reverb_python() -> Path | None:
    """``RLREPLAY_REVERB_PYTHON``, else ``.venv-reverb/bin/python``, if it exists (``make``
    builds it: ``make .venv-reverb/bin/python``)."""
    named = os.environ.get("RLREPLAY_REVERB_PYTHON")
    python = (
        Path(named) if named else Path(__file__).resolve().parents[1] / ".venv-reverb/bin/python"
    )
    return python if python.exists() else None


def reverb_rows(python: Path, args: argparse.Namespace) -> list[list[object]]:
    """Reverb's server and client, each in its own process: push and sample figures."""
    server = subprocess.Popen(
        [str(python), "-c", _REVERB_SERVER % CAPACITY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        port = int(server.stdout.readline())
        script = _REVERB_CLIENT % (
            PUSH_ITEMS,
            ITEM_BYTES,
            ITEM_BYTES,
            SAMPLE_ITEMS,
            SAMPLE_ITEMS,
            LATENCY_PUSHES,
        )

        def run(mode: str, seconds: float) -> dict[str, float]:
            out = subprocess.run(
                [str(python), "-c", script, mode, str(port), str(seconds)],
                capture_output=True,
                text=True,
                check=True,
                timeout=seconds + 120,
            ).stdout
            result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
            return result

        run("push", 1.0)  # prefill
        rows: list[list[object]] = []
        for mode, label in (
            ("push", "trajectory_writer, flush() per 64 items"),
            ("pipelined", "trajectory_writer, flush(block_until_num_items=512) per 64"),
            ("sample", "TrajectoryDataset(...).batch(256)"),
        ):
            runs = [run(mode, args.duration) for _ in range(args.repeats)]
            median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            latency = mode == "push"
            rows.append(
                [
                    label,
                    median["rate"],
                    median["p50"] if latency else "",
                    median["p99"] if latency else "",
                ]
            )
        return rows
    finally:
        server.stdin.close()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# --- the section ---------------------------------------------------------------------------


def _start_server(workdir: Path, durability: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data_dir = workdir / f"data-{durability}"
    proc = start_process(
        serve_command(
            port,
            data_dir,
            "--storage-mode",
            "hybrid",
            "--durability",
            durability,
            "--log-level",
            "warning",
            "--cache-memory-limit-mb",
            "2048",
        ),
        url,
        "/readyz",
        workdir / f"server-{durability}.log",
    )
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            c.put(
                f"/v1/tables/{TABLE}", json={"max_size": CAPACITY, "remover": {"type": "fifo"}}
            ).raise_for_status()
            arr = _columns(np.random.default_rng(2))
            for n in range(PRELOAD // PUSH_ITEMS):
                body = bytes(
                    encode_body(columns_request(_keys(f"p{n:09d}"), {"x": arr}, None, True))
                )
                c.post(
                    f"/v1/tables/{TABLE}/items",
                    content=body,
                    headers={"content-type": "application/msgpack"},
                ).raise_for_status()
    except BaseException:
        stop_process(proc)
        raise
    return proc, url


def main(argv: list[str] | None = None) -> None:
    """Measures the codec, one client process and push latency; prints three tables."""
    parser = argparse.ArgumentParser(prog="python -m bench.client", description=__doc__)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per run")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs per figure")
    parser.add_argument("--connections", type=int, default=4, help="wrk keep-alive connections")
    parser.add_argument("--quick", action="store_true", help="1 pair of 1.5 s runs per figure")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.repeats = 1.5, 1
    has_wrk = shutil.which("wrk") is not None
    if not has_wrk:
        print(
            "python -m bench.client: wrk is not installed (apt-get install -y wrk); "
            "its rows skipped"
        )

    print_table(
        f"Codec in process: a push of {PUSH_ITEMS} values {{'x': 4 KiB uint8}}, µs per array "
        "(median of 5)",
        ["route", "encode µs/array", "decode µs/array", "body bytes"],
        codec_rows(args.duration),
    )
    latency: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        proc, url = _start_server(workdir, "wal")
        try:
            rows = client_rows(url, args, workdir, has_wrk)
            latency += latency_rows(url, "wal", args.duration)
        finally:
            stop_process(proc)
        proc, url = _start_server(workdir, "none")
        try:  # pushes as Reverb makes them: with no log
            rows += client_rows(
                url, args, workdir, has_wrk, ("writer", "columns4"), ", durability none"
            )
            latency += latency_rows(url, "none", args.duration)
        finally:
            stop_process(proc)
        latency.append(fsync_row(workdir, args.duration))
    print_table(
        f"One client process vs wrk on the same bytes: hybrid, durability wal (but for the "
        f"rows that say none), table capped at "
        f"{CAPACITY:,} (fifo), new keys per push; wrk: 1 thread, {args.connections} "
        f"connections; {args.repeats} pair(s) of {args.duration:g} s runs, medians; "
        f"{os.cpu_count()} CPUs",
        ["client call", "client items/s", "wrk items/s", "client / wrk"],
        rows,
    )
    print_table(
        f"Single-producer push latency, ms (one push of {PUSH_ITEMS} x 4 KiB at a time, "
        f"hybrid; up to {LATENCY_PUSHES} pushes or {args.duration:g} s)",
        ["what", "p50 ms", "p99 ms", "n"],
        latency,
    )
    python = reverb_python()
    if python is None:
        print(
            "\npython -m bench.client: no Reverb venv (make .venv-reverb/bin/python); "
            "its rows skipped"
        )
        return
    reverb = reverb_rows(python, args)
    print_table(
        f"Reverb 0.14 on the same machine: server and Python client each in a process of its "
        f"own, table capped at {CAPACITY:,} (Fifo remover, Uniform sampler), no durability "
        f"(Reverb only checkpoints); {args.repeats} run(s) of {args.duration:g} s, medians; "
        "latency: one batch of 64 x 4 KiB, append to flush",
        ["client call", "items/s", "p50 ms", "p99 ms"],
        reverb,
    )
    print_table(
        "One rlreplay client process against Reverb's, from this run (target: 5x); pushes "
        "against Reverb's faster writer (512 items in flight)",
        ["rlreplay call", "rlreplay items/s", "Reverb items/s", "rlreplay / Reverb"],
        against_reverb(rows, reverb),
    )


def against_reverb(rows: list[list[object]], reverb: list[list[object]]) -> list[list[object]]:
    """rlreplay's client figures over Reverb's: pushes over its writer with 512 items in
    flight, samples over its dataset."""
    push, sample = float(reverb[1][1]), float(reverb[2][1])  # type: ignore[arg-type]
    out: list[list[object]] = []
    for row in rows:
        label, rate = str(row[0]), float(row[1])  # type: ignore[arg-type]
        theirs = sample if label.startswith("stream") else push
        out.append([label, rate, theirs, rate / theirs])
    return out


if __name__ == "__main__":
    main()
