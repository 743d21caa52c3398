"""Engine benchmark: committed push, get (cache and RocksDB hits) and sample, per mode.

Baselines measured in the same run: a Python dict, and raw ``rocksdict`` batched puts
(WriteBatch + ``sync=True``, the same durability as ``--durability wal``) and batched
multi-gets. Every figure is the median of several runs, in items per second.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
from rocksdict import Options, Rdict, WriteBatch, WriteOptions  # type: ignore[import-untyped]

from bench.report import print_table
from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem

BATCH = 256
MIN_TIMED_S = 0.3  # short loops are all noise: gets repeat whole passes for at least this
PUSHERS = 4  # concurrent pushers for the group-commit column


def _values(n: int, size: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    blob = rng.bytes(size + n)
    return [blob[i : i + size] for i in range(n)]


def _rate(samples: list[float]) -> float:
    return median(samples)


def dict_baseline(keys: list[str], values: list[bytes], repeats: int) -> tuple[float, float]:
    """Items/s of dict inserts and dict gets of the same keys."""
    puts, gets = [], []
    for _ in range(repeats):
        d: dict[str, bytes] = {}
        t0 = time.perf_counter()
        for k, v in zip(keys, values, strict=True):
            d[k] = v
        puts.append(len(keys) / (time.perf_counter() - t0))
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < MIN_TIMED_S:  # whole passes over the keys
            for start in range(0, len(keys), BATCH):
                _ = [d[k] for k in keys[start : start + BATCH]]
            done += len(keys)
        gets.append(done / (time.perf_counter() - t0))
    return _rate(puts), _rate(gets)


def rocksdict_baseline(
    keys: list[str], values: list[bytes], repeats: int, *, sync: bool
) -> tuple[float, float]:
    """Items/s of raw batched puts (one WriteBatch per BATCH items) and batched multi-gets."""
    puts, gets = [], []
    for _ in range(repeats):
        path = tempfile.mkdtemp(prefix="bench-rocks-")
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        db = Rdict(path, opts)
        wo = WriteOptions()
        wo.sync = sync
        bkeys = [k.encode() for k in keys]
        t0 = time.perf_counter()
        for start in range(0, len(keys), BATCH):
            wb = WriteBatch(raw_mode=True)
            for k, v in zip(
                bkeys[start : start + BATCH], values[start : start + BATCH], strict=True
            ):
                wb.put(k, v)
            db.write(wb, wo)
        puts.append(len(keys) / (time.perf_counter() - t0))
        db.flush(True)
        order = np.random.default_rng(1).permutation(len(bkeys))
        shuffled = [bkeys[i] for i in order]
        t0 = time.perf_counter()
        for start in range(0, len(keys), BATCH):
            db.get(shuffled[start : start + BATCH])
        gets.append(len(keys) / (time.perf_counter() - t0))
        db.close()
        shutil.rmtree(path, ignore_errors=True)
    return _rate(puts), _rate(gets)


async def _pusher(eng: Engine, items: list[NewItem], first: int, lane: int) -> None:
    for start in range(first + lane * BATCH, len(items), PUSHERS * BATCH):
        await eng.push("t", items[start : start + BATCH], wait=True)


async def engine_rates(
    mode: str, keys: list[str], values: list[bytes], repeats: int, *, durability: str
) -> dict[str, float]:
    """Committed push, cache-hit get, RocksDB-hit get and sample rates for one mode."""
    total = sum(len(v) for v in values)
    out: dict[str, list[float]] = {
        "push": [],
        "push4": [],
        "get_cache": [],
        "get_disk": [],
        "sample": [],
    }
    for _ in range(repeats):
        data = Path(tempfile.mkdtemp(prefix="bench-engine-"))
        limit_mb = (total * 2 if mode != "disk" else 64 * 2**20) / 2**20
        eng = Engine(
            Settings(
                data_dir=data,
                storage_mode=mode,
                durability=durability,  # type: ignore[arg-type]
                cache_memory_limit_mb=limit_mb,
                wal_checkpoint_mb=4096,
            )
        )
        await eng.start()
        await eng.create_table("t", TableConfig())
        items = [NewItem(k, v, 1.0) for k, v in zip(keys, values, strict=True)]
        half = len(items) // 2
        t0 = time.perf_counter()
        for start in range(0, half, BATCH):
            await eng.push("t", items[start : min(half, start + BATCH)], wait=True)
        out["push"].append(half / (time.perf_counter() - t0))

        t0 = time.perf_counter()
        await asyncio.gather(*(_pusher(eng, items, half, lane) for lane in range(PUSHERS)))
        out["push4"].append((len(items) - half) / (time.perf_counter() - t0))
        if mode != "disk":  # everything is cached: cache-hit gets
            done, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < MIN_TIMED_S:  # whole passes over the keys
                for start in range(0, len(keys), BATCH):
                    await eng.get_batch("t", keys[start : start + BATCH])
                done += len(keys)
            out["get_cache"].append(done / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        n_sampled = 0
        while time.perf_counter() - t0 < 0.5:
            n_sampled += len(await eng.sample("t", BATCH))
        out["sample"].append(n_sampled / (time.perf_counter() - t0))
        await eng.stop()
        if mode != "memory":  # reopen with a tiny cache: every get is a RocksDB hit
            eng = Engine(
                Settings(
                    data_dir=data,
                    storage_mode=mode,
                    durability=durability,  # type: ignore[arg-type]
                    cache_memory_limit_mb=0.001,
                )
            )
            await eng.start()
            order = np.random.default_rng(1).permutation(len(keys))
            shuffled = [keys[i] for i in order]
            t0 = time.perf_counter()
            for start in range(0, len(keys), BATCH):
                await eng.get_batch("t", shuffled[start : start + BATCH])
            out["get_disk"].append(len(keys) / (time.perf_counter() - t0))
            await eng.stop()
        shutil.rmtree(data, ignore_errors=True)
    return {k: (_rate(v) if v else float("nan")) for k, v in out.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench engine")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 5
    rows: list[list[Any]] = []
    ratios: list[list[Any]] = []
    for size, n in (
        (1024, 50_000 if args.quick else 100_000),
        (40 * 1024, 3_000 if args.quick else 6_000),
    ):
        keys = [f"key-{i:08d}" for i in range(n)]
        values = _values(n, size)
        label = f"{size // 1024} KiB"
        dput, dget = dict_baseline(keys, values, repeats)
        rput_sync, rget = rocksdict_baseline(keys, values, repeats, sync=True)
        rput_nowal, _ = rocksdict_baseline(keys, values, repeats, sync=False)
        nan = float("nan")
        rows.append([label, "python dict", dput, nan, dget, nan, nan])
        rows.append([label, "rocksdict batch, sync WAL", rput_sync, nan, nan, rget, nan])
        rows.append([label, "rocksdict batch, no sync", rput_nowal, nan, nan, nan, nan])
        for mode in ("memory", "disk", "hybrid"):
            r = asyncio.run(engine_rates(mode, keys, values, repeats, durability="wal"))
            rows.append(
                [
                    label,
                    f"rlreplay {mode} (wal)",
                    r["push"],
                    r["push4"],
                    r["get_cache"],
                    r["get_disk"],
                    r["sample"],
                ]
            )
            if mode == "hybrid":
                ratios.append(
                    [
                        label,
                        "committed hybrid push / rocksdict sync batch",
                        r["push"] / rput_sync,
                        0.5,
                    ]
                )
                ratios.append(
                    [label, f"same, {PUSHERS} pushers (group commit)", r["push4"] / rput_sync, 0.5]
                )
                ratios.append([label, "cache-hit get / dict get", r["get_cache"] / dget, 0.3])
                ratios.append(
                    [
                        label,
                        "RocksDB-hit get / rocksdict multi-get",
                        r["get_disk"] / rget,
                        float("nan"),
                    ]
                )
        r = asyncio.run(engine_rates("hybrid", keys, values, repeats, durability="none"))
        rows.append(
            [
                label,
                "rlreplay hybrid (none)",
                r["push"],
                r["push4"],
                r["get_cache"],
                r["get_disk"],
                r["sample"],
            ]
        )
        ratios.append(
            [
                label,
                "hybrid push (none) / rocksdict no-sync batch",
                r["push"] / rput_nowal,
                float("nan"),
            ]
        )
    print_table(
        f"Engine, in process, items/s (median of {repeats}; batches of {BATCH}; push = committed)",
        [
            "value",
            "system",
            "push",
            f"push x{PUSHERS}",
            "get (cache hit)",
            "get (RocksDB hit)",
            "sample",
        ],
        rows,
    )
    print_table("Engine targets", ["value", "ratio", "measured", "target"], ratios)


if __name__ == "__main__":
    main()
