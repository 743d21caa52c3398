"""HTTP throughput of ``rlreplay serve`` next to the framework's ceiling, measured in one run.

* push: ``POST /v1/tables/bench/items`` with 64 items of 4 KiB each (msgpack); the keys
  cycle over 16 bodies x 64 keys, so after the first round pushes replace items.
* new-key push (the second table): the same bodies, but every key new (wrk writes a request
  counter into the keys of 16 body templates), into a table capped at 50,000 items: after
  the first ~780 pushes every push also evicts 64 items (the FIFO remover). That is the
  steady state of a replay buffer; building each body costs wrk a copy more, which lowers
  the ceiling too.
* sample: ``POST /v1/tables/default/sample`` of 256 items of 4 KiB (msgpack answer, ~1 MiB),
  from a table preloaded with 4096 items.

The ceiling is a trivial FastAPI app served by the same uvicorn configuration, whose
endpoints parse the same bodies (the push body fully unpacked) and answer the same number of
bytes with no replay work. The load generator is ``wrk`` (a separate C process, keep-alive
connections, a Lua script for the POST bodies); it must be installed (``apt-get install wrk``).

The ceiling stays up for the whole run, and each figure is a median over pairs of wrk runs,
the ceiling's and the server's back to back (alternating which goes first); the ratio
column is the median of the pairs' ratios. On this shared machine a lone figure moved by up
to 2x between runs minutes apart, the ceiling's included; ratios of adjacent runs are much
steadier. ``stream()`` runs are paired the same way with a wrk sample run.

Run: ``python -m bench.http [--duration 5] [--repeats 3] [--connections 16]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import msgpack
from fastapi import FastAPI, Request, Response

from bench.report import print_table
from rlreplay.app.cli import serve_command, uvicorn_options
from rlreplay.app.settings import Settings

ITEM_BYTES = 4096
PUSH_ITEMS = 64
SAMPLE_ITEMS = 256
PUSH_BODIES = 16
PRELOAD = 4096


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_ready(url: str, path: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready")


#: Stands for a request counter in the keys of a push template (:func:`_push_template`).
KEY_MARK = b"@" * 10


def _push_template() -> bytes:
    """A push body whose keys wrk makes new for every request: ``KEY_MARK/<i>``."""
    value = msgpack.packb({"obs": os.urandom(ITEM_BYTES - 16)})
    mark = KEY_MARK.decode()
    body: bytes = msgpack.packb(
        {
            "items": [
                {"key": f"{mark}/{i}", "value": value, "priority": 1.0} for i in range(PUSH_ITEMS)
            ]
        }
    )
    assert body.count(KEY_MARK) == PUSH_ITEMS
    return body


def push_body(n: int) -> bytes:
    value = msgpack.packb({"obs": os.urandom(ITEM_BYTES - 16)})
    body: bytes = msgpack.packb(
        {
            "items": [
                {"key": f"b{n}/{i}", "value": value, "priority": 1.0} for i in range(PUSH_ITEMS)
            ]
        }
    )
    return body


SAMPLE_BODY = msgpack.packb({"batch_size": SAMPLE_ITEMS})


def ceiling_app() -> FastAPI:
    """The framework's ceiling: same bodies parsed, same-size answers, no replay work.

    ``Request`` and ``Response`` are imported at module level: FastAPI resolves the
    endpoints' (postponed) annotations in the module's globals, and a ``request`` it cannot
    resolve becomes a required query parameter (every call a 422).
    """
    app = FastAPI()
    value = msgpack.packb({"obs": os.urandom(ITEM_BYTES - 16)})
    item = {
        "key": "k" * 8,
        "value": value,
        "priority": 1.0,
        "probability": 0.1,
        "weight": 1.0,
        "times_sampled": 1,
    }
    sample_answer = msgpack.packb({"items": [item] * SAMPLE_ITEMS})
    push_answer = msgpack.packb({"accepted": PUSH_ITEMS})

    @app.post("/push")
    async def push(request: Request) -> Response:
        body = msgpack.unpackb(await request.body())
        assert len(body["items"]) == PUSH_ITEMS
        return Response(push_answer, status_code=202, media_type="application/msgpack")

    @app.post("/sample")
    async def sample(request: Request) -> Response:
        body = msgpack.unpackb(await request.body())
        assert body["batch_size"] == SAMPLE_ITEMS
        return Response(sample_answer, media_type="application/msgpack")

    @app.get("/readyz")
    async def ready() -> Response:
        return Response(b"{}", media_type="application/json")

    return app


def serve_ceiling(port: int) -> None:
    """Serves :func:`ceiling_app` with the uvicorn configuration of ``rlreplay serve``."""
    import uvicorn

    options = uvicorn_options(Settings())
    uvicorn.run(ceiling_app(), host="127.0.0.1", port=port, log_level="warning", **options)


_LUA = """
local bodies = {}
local n = 0
local mark = "@@@@@@@@@@"
local base = 0
local counter = 0
local headers = {["Content-Type"] = "application/msgpack", ["Accept"] = "application/msgpack"}
local heads = {}
function init(args)
  local count = tonumber(args[1])
  base = tonumber(args[3])
  for i = 0, count - 1 do
    local f = assert(io.open(args[2] .. "/body" .. i .. ".bin", "rb"))
    local body = f:read("*all")
    f:close()
    -- split at the key marks: a request joins the pieces with its own number
    local pieces, pos = {}, 1
    while true do
      local s, e = string.find(body, mark, pos, true)
      if not s then break end
      pieces[#pieces + 1] = string.sub(body, pos, s - 1)
      pos = e + 1
    end
    pieces[#pieces + 1] = string.sub(body, pos)
    bodies[i] = pieces
    -- the request without its body (the length is the same for every request)
    local full = wrk.format("POST", nil, headers, body)
    heads[i] = string.sub(full, 1, #full - #body)
  end
  n = count
end
local i = 0
function request()
  i = (i + 1) % n
  local pieces = bodies[i]
  if #pieces == 1 then
    return heads[i] .. pieces[1]
  end
  counter = counter + 1
  local id = string.format("%010d", base + counter)
  local parts = {heads[i]}
  for j = 1, #pieces - 1 do
    parts[2 * j] = pieces[j]
    parts[2 * j + 1] = id
  end
  parts[2 * #pieces] = pieces[#pieces]
  return table.concat(parts)
end
"""
_wrk_runs = 0


def _wrk(
    url: str, bodies: list[bytes], *, duration: float, connections: int, workdir: Path
) -> tuple[float, int]:
    """Runs wrk against ``url`` with ``bodies`` in turn; (2xx answers/s, non-2xx answers).

    Key marks (:data:`KEY_MARK`) in a body are replaced by a number no request of this
    process has used, so every pushed key is new."""
    global _wrk_runs
    _wrk_runs += 1
    for i, body in enumerate(bodies):
        (workdir / f"body{i}.bin").write_bytes(body)
    script = workdir / "post.lua"
    script.write_text(_LUA)
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(duration))}s",
            "-s",
            str(script),
            url,
            "--",
            str(len(bodies)),
            str(workdir),
            str(_wrk_runs * 10**7),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=duration + 60,
    ).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    found = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    bad = int(found.group(1)) if found else 0
    # only answered work counts: a 503 overloaded is cheap and would inflate the rate
    return (rate * (total - bad) / total if total else 0.0), bad


#: What :func:`paired` measures: ceiling rate, server rate, their ratio, non-2xx answers.
PairFigures = tuple[float, float, float, int]


def paired(
    urls: tuple[str, str],
    bodies: list[bytes],
    items: int,
    args: argparse.Namespace,
    workdir: Path,
) -> PairFigures:
    """Alternate wrk runs on ``urls`` (the ceiling, then the server; then the other way).

    Returns the median rate of each (items/s), the median of the per-pair ratios
    server/ceiling, and the non-2xx answers of both. Pairing runs that are seconds apart
    cancels most of this shared machine's drift, which moved single figures by 2x here.
    """
    rates: tuple[list[float], list[float]] = ([], [])
    ratios, bad = [], 0
    for i in range(args.repeats):
        pair = [0.0, 0.0]
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            rate, errors = _wrk(
                urls[which],
                bodies,
                duration=args.duration,
                connections=args.connections,
                workdir=workdir,
            )
            pair[which] = rate * items
            rates[which].append(rate * items)
            bad += errors
        ratios.append(pair[1] / pair[0])
    return statistics.median(rates[0]), statistics.median(rates[1]), statistics.median(ratios), bad


def start_process(cmd: list[str], url: str, ready: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    _wait_ready(url, ready, proc)
    return proc


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


_STREAM = """
import asyncio, sys, time
from rlreplay.clients import ReplayClient, tune_malloc

tune_malloc()  # a trainer taking 1 MB batches opts in (the client never does it by itself)

async def main(url, seconds):
    async with ReplayClient(url) as rb:
        got, started = 0, time.perf_counter()
        async for batch in rb.stream("default", batch_size=%d, prefetch=4):
            got += len(batch)
            if time.perf_counter() - started > seconds:
                break
        print(got / (time.perf_counter() - started))

asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""


def _stream_once(url: str, args: argparse.Namespace) -> float:
    """Items/s that ``ReplayClient.stream`` (prefetch 4) takes from ``url``, in its own process."""
    out = subprocess.run(
        [sys.executable, "-c", _STREAM % SAMPLE_ITEMS, url, str(args.duration)],
        capture_output=True,
        text=True,
        check=True,
        timeout=args.duration + 60,
    ).stdout
    return float(out.strip().splitlines()[-1])


def _stream_vs_wrk(url: str, args: argparse.Namespace, workdir: Path) -> tuple[float, float]:
    """Median ``stream()`` rate and median ratio stream / wrk over adjacent pairs of runs."""
    rates, ratios = [], []
    for _ in range(args.repeats):
        stream = _stream_once(url, args)
        wrk, _ = _wrk(
            url + "/v1/tables/default/sample",
            [SAMPLE_BODY],
            duration=args.duration,
            connections=args.connections,
            workdir=workdir,
        )
        rates.append(stream)
        ratios.append(stream / (wrk * SAMPLE_ITEMS))
    return statistics.median(rates), statistics.median(ratios)


def wrk_arguments(parser: argparse.ArgumentParser, *, duration: float) -> None:
    """The load options every wrk-driven section takes."""
    parser.add_argument("--duration", type=float, default=duration, help="seconds per run")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs per figure")
    parser.add_argument("--connections", type=int, default=16, help="wrk keep-alive connections")
    parser.add_argument("--quick", action="store_true", help="2 pairs of 2 s runs")


def parse_wrk_arguments(
    parser: argparse.ArgumentParser, argv: list[str] | None
) -> argparse.Namespace | None:
    """The parsed options (``--quick`` applied), or None when wrk is missing (said so)."""
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.repeats = 2.0, 2
    if shutil.which("wrk") is None:
        print(f"{parser.prog}: wrk is not installed (apt-get install -y wrk); skipped")
        return None
    return args


def main(argv: list[str] | None = None) -> None:
    """Measures push and sample throughput of the server and of the ceiling; prints a table."""
    parser = argparse.ArgumentParser(prog="python -m bench.http", description=__doc__)
    wrk_arguments(parser, duration=5.0)
    parser.add_argument(
        "--modes",
        default="memory,hybrid,hybrid:none",
        help="storage modes to measure, each optionally :durability",
    )
    parser.add_argument("--log-level", default="info", help="the server's log level")
    args = parse_wrk_arguments(parser, argv)
    if args is None:
        return
    push_bodies = [push_body(n) for n in range(PUSH_BODIES)]
    templates = [_push_template() for _ in range(PUSH_BODIES)]
    rows: list[list[object]] = []
    fresh_rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        port = free_port()
        ceiling = f"http://127.0.0.1:{port}"
        ceiling_proc = start_process(
            [sys.executable, "-c", f"from bench.http import serve_ceiling; serve_ceiling({port})"],
            ceiling,
            "/readyz",
            workdir / "ceiling.log",
        )
        try:
            for spec in args.modes.split(","):
                row, fresh = _measure_mode(spec, ceiling, (push_bodies, templates), args, workdir)
                rows.append(row)
                fresh_rows.append(fresh)
        finally:
            stop_process(ceiling_proc)
    print_table(
        f"HTTP throughput: push {PUSH_ITEMS} x 4 KiB, sample {SAMPLE_ITEMS} x 4 KiB (msgpack); "
        f"load: wrk, 1 thread, {args.connections} keep-alive connections; "
        f"{args.repeats} pairs of {args.duration:g} s runs, the ceiling's and the server's "
        f"in turn, medians; {os.cpu_count()} CPUs; stream = ReplayClient.stream(prefetch=4) "
        "in a separate process, each run paired with a wrk sample run",
        [
            "server",
            "pushed items/s",
            "ceiling push",
            "push / ceiling",
            "sampled items/s",
            "ceiling sample",
            "sample / ceiling",
            "stream() items/s",
            "stream / sample",
            "non-2xx",
        ],
        rows,
    )
    print_table(
        f"HTTP pushes of {PUSH_ITEMS} new keys x 4 KiB into a table capped at 50,000 items "
        "(each push also evicts 64); same load and pairing",
        ["server", "pushed items/s", "ceiling push", "push / ceiling", "non-2xx"],
        fresh_rows,
    )


def _measure_mode(
    spec: str,
    ceiling: str,
    bodies: tuple[list[bytes], list[bytes]],
    args: argparse.Namespace,
    workdir: Path,
) -> tuple[list[object], list[object]]:
    """The rows of ``rlreplay serve`` in ``spec`` (mode[:durability]) against the ceiling:
    the main table's, and the new-key pushes' (``bodies``: repeated ones, templates)."""
    push_bodies, templates = bodies
    mode, _, durability = spec.partition(":")
    durability = durability or "wal"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_process(
        serve_command(
            port,
            workdir / f"data-{mode}-{durability}",
            "--storage-mode",
            mode,
            "--durability",
            durability,
            "--log-level",
            args.log_level,
            "--cache-memory-limit-mb",
            "2048",
        ),
        url,
        "/readyz",
        workdir / f"server-{mode}-{durability}.log",
    )
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            c.put("/v1/tables/bench", json={"max_size": 50_000}).raise_for_status()
            c.put("/v1/tables/fresh", json={"max_size": 50_000}).raise_for_status()
            for n in range(PRELOAD // PUSH_ITEMS):
                r = c.post(
                    "/v1/tables/default/items",
                    content=push_body(1000 + n),
                    headers={"content-type": "application/msgpack"},
                )
                r.raise_for_status()

        def pair(route: str, path: str, bodies: list[bytes], items: int) -> PairFigures:
            return paired((ceiling + route, url + path), bodies, items, args, workdir)

        ceiling_push, push, push_ratio, bad_push = pair(
            "/push", "/v1/tables/bench/items", push_bodies, PUSH_ITEMS
        )
        ceiling_sample, sample, sample_ratio, bad_sample = pair(
            "/sample", "/v1/tables/default/sample", [SAMPLE_BODY], SAMPLE_ITEMS
        )
        stream, stream_ratio = _stream_vs_wrk(url, args, workdir)
        ceiling_fresh, fresh, fresh_ratio, bad_fresh = pair(
            "/push", "/v1/tables/fresh/items", templates, PUSH_ITEMS
        )
    finally:
        stop_process(proc)
    name = f"rlreplay {mode}, durability {durability}"
    fresh_row: list[object] = [name, fresh, ceiling_fresh, fresh_ratio, bad_fresh]
    return [
        name,
        push,
        ceiling_push,
        push_ratio,
        sample,
        ceiling_sample,
        sample_ratio,
        stream,
        stream_ratio,
        bad_push + bad_sample,
    ], fresh_row


if __name__ == "__main__":
    main()
