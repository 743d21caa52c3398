"""The GPU path in one command (``make gpu-check``), for whoever next has a CUDA device.

In this order, each step bounded so that the whole takes under 8 minutes:

1. the CUDA tests (``pytest -m cuda``);
2. host-to-device bandwidth: a ``torch`` copy of 4, 64 and 256 MiB from pinned and from
   pageable host memory, then rlreplay's path for a batch of 32 x 400 KiB token rows (a
   local ``rlreplay serve``, ``get_many(layout="columns")`` over TCP and the Unix socket,
   then ``ColumnBatch.as_torch("cuda", non_blocking=True)``), its copy to the device
   printed next to a pinned ``torch`` copy of the same bytes;
3. the sidecar benchmark (``python -m bench.sidecar --quick``);
4. the bulk benchmark (``python -m bench.bulk --quick --rounds 1``).

Where torch sees no CUDA device it says so in one line and exits 0 (nothing to measure).
Otherwise the exit status is 1 when a step failed or ran past its time.

Run: ``python -m bench.gpu_check``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import print_table

MIB = 1 << 20
#: (what, command, seconds at most): the steps run as their own processes. With the
#: copies measured in process (about a minute), the whole stays under 8 minutes.
STEPS: tuple[tuple[str, list[str], int], ...] = (
    (
        "CUDA tests",
        [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider"],
        150,
    ),
    ("sidecar benchmark", [sys.executable, "-m", "bench.sidecar", "--quick"], 110),
    ("bulk benchmark", [sys.executable, "-m", "bench.bulk", "--quick", "--rounds", "1"], 110),
)


def cuda_device() -> tuple[Any, str]:
    """(torch, the device's name), or (None, why there is none)."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build"
        return None, f"torch {torch.__version__}, {built}, sees none"
    return torch, torch.cuda.get_device_name(0)


def _seconds(run: Callable[[], None], sync: Callable[[], None], repeats: int) -> float:
    """Median seconds of ``run`` (synchronised), after one warm-up."""
    run()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_rows(torch: Any) -> list[list[object]]:
    """GB/s of host-to-device copies from pinned and from pageable memory."""
    rows: list[list[object]] = []
    sync = torch.cuda.synchronize
    for size in (4 * MIB, 64 * MIB, 256 * MIB):
        pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        pageable = torch.empty(size, dtype=torch.uint8)
        device = torch.empty(size, dtype=torch.uint8, device="cuda")

        def from_pinned(p: Any = pinned, d: Any = device) -> None:
            d.copy_(p, non_blocking=True)

        def from_pageable(p: Any = pageable, d: Any = device) -> None:
            d.copy_(p)

        on_pinned = _seconds(from_pinned, sync, 9)
        on_pageable = _seconds(from_pageable, sync, 9)
        rows.append([f"{size // MIB} MiB", size / on_pinned / 1e9, size / on_pageable / 1e9])
        del pinned, pageable, device
    return rows


async def _batch_rates(torch: Any, url: str, repeats: int) -> list[float]:
    """GB/s: get_many alone; get_many then as_torch('cuda'); the batch's own copy to the
    device; a pinned torch copy of the same bytes."""
    from bench.bulk import _fill
    from rlreplay.clients import ReplayClient

    rng = np.random.default_rng(5)
    values = [{"tokens": row} for row in rng.integers(0, 2**31 - 1, (32, 100 * 1024), np.int32)]
    keys = [f"k{i}" for i in range(len(values))]
    nbytes = sum(v["tokens"].nbytes for v in values)
    sync = torch.cuda.synchronize
    async with ReplayClient(url, timeout_s=120) as rb:
        if "gpu" not in {t["name"] for t in await rb.list_tables()}:
            await _fill(rb, "gpu", values)
        got = []
        for to_device in (False, True):
            await rb.get_many("gpu", keys, layout="columns")
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                batch = await rb.get_many("gpu", keys, layout="columns")
                if to_device:
                    batch.as_torch("cuda", non_blocking=True)
                    sync()
                times.append(time.perf_counter() - t0)
            got.append(nbytes / statistics.median(times) / 1e9)
        batch = await rb.get_many("gpu", keys, layout="columns")
    column = batch["tokens"]
    as_is = _seconds(lambda: batch.as_torch("cuda", non_blocking=True), sync, repeats)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pinned.numpy()[:] = np.asarray(column).reshape(-1).view(np.uint8)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    on_pinned = _seconds(lambda: device.copy_(pinned, non_blocking=True), sync, repeats)
    return [*got, nbytes / as_is / 1e9, nbytes / on_pinned / 1e9]


def batch_rows(torch: Any, repeats: int = 15) -> list[list[object]]:
    """rlreplay's batch to the device over TCP and the Unix socket."""
    from bench.bulk import _server
    from bench.http import stop_process

    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory(prefix="rlgpu") as folder:
        sock = Path(folder) / "replay.sock"
        proc, url = _server(Path(folder) / "server", sock)
        try:
            for family, address in (("tcp", url), ("unix", f"unix://{sock}")):
                rates = asyncio.run(_batch_rates(torch, address, repeats))
                rows.append(["32 x 400 KiB", family, *rates])
        finally:
            stop_process(proc)
    return rows


def run_step(what: str, command: list[str], limit_s: int) -> bool:
    """Runs one step, its output passed through; whether it passed in time."""
    print(f"\n## {what} (at most {limit_s} s): {' '.join(command[1:])}", flush=True)
    t0 = time.perf_counter()
    try:
        code = subprocess.run(command, timeout=limit_s, check=False).returncode
    except subprocess.TimeoutExpired:
        print(f"gpu-check: {what} ran past {limit_s} s", flush=True)
        return False
    print(f"gpu-check: {what}: exit status {code} in {time.perf_counter() - t0:.0f} s", flush=True)
    return code == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__)
    parser.parse_args(argv)
    torch, device = cuda_device()
    if torch is None:
        print(f"gpu-check: no CUDA device found ({device}); nothing to measure", flush=True)
        return 0
    print(f"# gpu-check on {device}", flush=True)
    ok = run_step(*STEPS[0])
    print_table(
        "Host to device, torch copies (GB/s, median of 9)",
        ["bytes", "from pinned", "from pageable"],
        copy_rows(torch),
    )
    print_table(
        "rlreplay's batch to the device (GB/s of array bytes, median of 15)",
        [
            "batch",
            "socket",
            "get_many",
            "get_many + as_torch(cuda)",
            "as_torch(cuda) alone",
            "pinned torch copy, same bytes",
        ],
        batch_rows(torch),
    )
    for step in STEPS[1:]:
        ok &= run_step(*step)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
