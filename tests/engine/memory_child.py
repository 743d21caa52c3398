"""Child process for the memory test: 600 MB of 40 KB values through a 32 MB hybrid cache.

Prints one JSON line with the resident-memory figures and whether every value read back.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import psutil

from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.storage.allocator import tune_allocator
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem

VALUE_BYTES = 40 * 1024
TOTAL_BYTES = 600 * 1024 * 1024
CACHE_MB = 32
BATCH = 16


def value_of(i: int) -> bytes:
    """A 40 KB incompressible value that can be rebuilt from its index."""
    seed = np.random.default_rng(i)
    return seed.bytes(VALUE_BYTES)


async def main(data_dir: str) -> None:
    proc = psutil.Process()
    # the bound is the server's: `rlreplay serve` tunes glibc's malloc for its process, and
    # an Engine made in another program leaves it alone (about 20 MB more slack here)
    tune_allocator()
    eng = Engine(
        Settings(
            data_dir=Path(data_dir),
            storage_mode="hybrid",
            cache_memory_limit_mb=CACHE_MB,
            io_threads=2,
        )
    )
    await eng.start()
    await eng.create_table("t", TableConfig())
    for i in range(64):  # warm the code paths, then measure from here
        await eng.push("t", [NewItem(f"w{i}", value_of(10**9 + i))], wait=True)
    await eng.delete("t", [f"w{i}" for i in range(64)], wait=True)
    gc.collect()
    baseline = proc.memory_info().rss
    peak = baseline
    n = TOTAL_BYTES // VALUE_BYTES
    digest = hashlib.sha256()
    for start in range(0, n, BATCH):
        batch = [NewItem(f"k{i}", value_of(i)) for i in range(start, min(n, start + BATCH))]
        await eng.push("t", batch, wait=True)
        peak = max(peak, proc.memory_info().rss)
    written_peak = peak
    ok = True
    for start in range(0, n, 64):
        keys = [f"k{i}" for i in range(start, min(n, start + 64))]
        got = await eng.get_many("t", keys)
        for i, g in zip(range(start, start + len(keys)), got, strict=True):
            if g is None or g.value != value_of(i):
                ok = False
            elif g is not None:
                digest.update(g.value[:8])
        peak = max(peak, proc.memory_info().rss)
    stats = eng.describe("t")["stats"]
    await eng.stop()
    print(
        json.dumps(
            {
                "items": n,
                "baseline_rss": baseline,
                "peak_rss_write": written_peak,
                "peak_rss": peak,
                "cache_limit": CACHE_MB * 2**20,
                "all_intact": ok,
                "stats": stats,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
