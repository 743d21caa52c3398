"""Child process for the replay memory test.

``write DIR MB``: pushes MB megabytes of 64 KB values with checkpoints pushed off, then stops
as ``kill -9`` leaves an engine (no final checkpoint): the whole log is left to replay.
``recover DIR``: starts an engine on DIR (which replays that log) and prints one JSON line
with its resident memory before the start and at its peak, and what came back.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.storage.allocator import tune_allocator
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from tests.engine.conftest import crash

VALUE_BYTES = 64 * 1024
CACHE_MB = 16
BATCH = 16


def settings(data_dir: str) -> Settings:
    """Hybrid storage with a small cache, and no checkpoint before a stop: neither by the
    log's size nor by the time its replay would take."""
    return Settings(
        data_dir=Path(data_dir),
        storage_mode="hybrid",
        cache_memory_limit_mb=CACHE_MB,
        wal_checkpoint_mb=1e6,
        recovery_bound_s=0,
        io_threads=2,
    )


def value_of(i: int) -> bytes:
    """A 64 KB incompressible value that can be rebuilt from its index."""
    return np.random.default_rng(i).bytes(VALUE_BYTES)


async def write(data_dir: str, megabytes: int) -> None:
    eng = Engine(settings(data_dir))
    await eng.start()
    await eng.create_table("t", TableConfig())
    n = megabytes * 2**20 // VALUE_BYTES
    for start in range(0, n, BATCH):
        batch = [NewItem(f"k{i}", value_of(i)) for i in range(start, min(n, start + BATCH))]
        await eng.push("t", batch, wait=True)
    await crash(eng)
    wal = Path(data_dir) / "wal"
    log_bytes = sum(p.stat().st_size for p in wal.glob("*.wal"))
    print(json.dumps({"items": n, "log_bytes": log_bytes}))


class PeakSampler:
    """Samples the process's resident memory from a thread until stopped."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        proc = psutil.Process()
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, proc.memory_info().rss)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _high_water_mark() -> int:
    """This process's peak resident memory so far, in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


async def recover(data_dir: str) -> None:
    tune_allocator()  # as `rlreplay serve` does
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts from here
    baseline = psutil.Process().memory_info().rss
    eng = Engine(settings(data_dir))
    began = time.monotonic()
    with PeakSampler() as sampler:
        await eng.start()
    seconds = time.monotonic() - began
    # the high-water mark catches a peak between samples (VmHWM: ru_maxrss would count the
    # parent's memory, forked before the exec)
    maxrss = _high_water_mark()
    stats = eng.describe("t")["stats"]
    intact = True
    for i in range(0, stats["size"], max(1, stats["size"] // 50)):
        got = (await eng.get_many("t", [f"k{i}"]))[0]
        intact = intact and got is not None and got.value == value_of(i)
    await eng.stop()
    print(
        json.dumps(
            {
                "baseline_rss": baseline,
                "peak_rss": max(sampler.peak, maxrss),
                "recovery_s": seconds,
                "replayed": eng.core.recovered_records,
                "size": stats["size"],
                "intact": intact,
            }
        )
    )


if __name__ == "__main__":
    if sys.argv[1] == "write":
        asyncio.run(write(sys.argv[2], int(sys.argv[3])))
    else:
        asyncio.run(recover(sys.argv[2]))
