"""Snapshot benchmark: taking, restoring and incrementally re-taking a snapshot of ~1 GB.

Run as ``python -m bench.snapshots [--quick]``. One hybrid table gets ~1 GB (``--quick``:
~128 MB) of 64 KiB values from ``os.urandom``, so no compression can shrink what travels;
the cache holds a quarter of it (``cache_memory_limit_mb``), so most values live only in
RocksDB, as in a server whose data outgrows its memory. Every figure sits next to its
baseline, measured in the same run on the same bytes:

* snapshot (``take_snapshot``, until the manifest is written) to a local folder and to an
  S3 server (moto's, in this process), against a plain copy of the data dir's ``rocksdb``
  folder (``shutil.copytree``; ``s3fs`` ``put``);
* restore (a new engine on an empty data dir with ``restore="latest"``, until ``start()``
  returns) against a plain copy back (``shutil.copytree`` of the backup's files;
  ``s3fs`` ``get``);
* the incremental snapshot after 5% of the items were overwritten (random keys): bytes
  uploaded, which counts the new values' table files and whatever RocksDB's compaction
  rewrote before the capture;
* push latency (one 4 KiB item at a time, ``wait`` false: acknowledged once in the log)
  while a full snapshot runs, against the same pusher with no snapshot; the event loop's
  longest stall meanwhile, and the writer's pause to capture
  (``Snapshots.last_capture_s``). Little is unflushed here (a warm-up's pushes); the
  capture first writes what is, so the incremental row's pause shows a busier writer's.

Each snapshot goes to a fresh backup URL, so each uploads everything. The machine's page
cache holds every byte here, so the figures are CPU and copying, not the disk. MB are
10^6 bytes; figures are medians over the repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import random
import shutil
import socket
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.report import print_table
from rlreplay.app.engine.engine import Engine
from rlreplay.app.engine.snapshots import Snapshots
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem

VALUE_BYTES = 64 * 1024
PUSH_BYTES = 4 * 1024
FILL_BATCH = 64  # items per push while filling (4 MiB)
CHANGED = 0.05  # share of the items the incremental snapshot follows
PUSH_KEYS = 1024  # the latency pusher overwrites these keys: the table does not grow
MAX_PUSHES = 200_000  # per latency run, whatever the time
MAX_PUSH_S = 60.0  # per latency run, whatever the count
WARMUP_S = 1.0  # pushes before timing: the log's writer process starts once the log is busy
TICK_S = 0.001  # the loop-stall probe's sleep
MIN_IDLE_S = 1.0  # the baseline pushes for as long as the snapshot took, and at least this
BUCKET = "rlreplay-bench"
S3_OPTIONS = {"key": "testing", "secret": "testing"}
MB = 1e6


@dataclass
class Samples:
    """Every repeat's figures by name; medians for the tables."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(value)

    def __getitem__(self, name: str) -> float:
        got = self.values.get(name)
        return statistics.median(got) if got else float("nan")


@contextlib.contextmanager
def s3_server() -> Iterator[dict[str, Any] | None]:
    """moto's S3 server on a free local port with the bench bucket; the engine's storage
    options for it, or None (and a note) when moto or s3fs is not installed."""
    try:
        import s3fs
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        print(f"\n(no S3 rows: {exc.name} is not installed)")
        yield None
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        fs = s3fs.S3FileSystem(**S3_OPTIONS, endpoint_url=endpoint)
        fs.mkdir(BUCKET)
        yield {**S3_OPTIONS, "client_kwargs": {"endpoint_url": endpoint}}
    finally:
        server.stop()


def s3_filesystem(options: dict[str, Any]) -> Any:
    """A plain s3fs client of the moto server, for the baselines."""
    import s3fs

    return s3fs.S3FileSystem(**options)


def settings(data: Path, cache_mb: float, url: str, options: dict[str, Any], **kw: Any) -> Settings:
    return Settings(
        data_dir=data,
        storage_mode="hybrid",
        cache_memory_limit_mb=cache_mb,
        backup_url=url,
        backup_interval_s=0,
        backup_storage_options=options,
        io_threads=2,
        default_table=False,
        **kw,
    )


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    """Seconds ``fn`` took, after a collection so no earlier garbage lands in the timing."""
    gc.collect()
    t0 = time.perf_counter()
    result = await fn()
    return time.perf_counter() - t0, result


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


async def push_random(engine: Engine, indices: list[int]) -> None:
    """Push fresh random values under keys ``k<index>``, applied when this returns."""
    for start in range(0, len(indices), FILL_BATCH):
        batch = indices[start : start + FILL_BATCH]
        items = [NewItem(f"k{i:07d}", os.urandom(VALUE_BYTES), 1.0) for i in batch]
        await engine.push("t", items, wait=True)


async def push_latencies(
    engine: Engine, running: asyncio.Task[Any] | None, seconds: float
) -> tuple[list[float], float]:
    """Seconds per push of one 4 KiB item, back to back, until ``running`` is done (or for
    ``seconds`` when None), bounded by :data:`MAX_PUSHES` and :data:`MAX_PUSH_S`; and the
    event loop's longest stall meanwhile (how late a :data:`TICK_S` sleep woke), which tells
    a push waiting on the engine from a loop that could not run it."""
    stalls = [0.0]
    done = asyncio.Event()

    async def tick() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(TICK_S)
            stalls.append(time.perf_counter() - t0 - TICK_S)

    ticker = asyncio.create_task(tick())
    value = os.urandom(PUSH_BYTES)
    out: list[float] = []
    end = time.perf_counter() + (MAX_PUSH_S if running is not None else min(seconds, MAX_PUSH_S))
    try:
        while len(out) < MAX_PUSHES and time.perf_counter() < end:
            if running is not None and running.done():
                break
            item = NewItem(f"p{len(out) % PUSH_KEYS}", value, 1.0)
            t0 = time.perf_counter()
            await engine.push("t", [item], wait=False)
            out.append(time.perf_counter() - t0)
    finally:
        done.set()
        await ticker
    return out, max(stalls)


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def snapshots_of(engine: Engine) -> Snapshots:
    snapshots = engine.snapshots
    if snapshots is None:
        raise RuntimeError("the engine has not started")
    return snapshots


class Run:
    """One repeat's engines, folders and figures. The data dir ``data`` (filled once) is
    shared by the repeats; the rest lives in ``root/r<repeat>``, which the caller removes."""

    def __init__(
        self,
        data: Path,
        repeat: int,
        *,
        items: int,
        cache_mb: float,
        s3: dict[str, Any] | None,
        out: Samples,
    ) -> None:
        self.data, self.repeat, self.items, self.cache_mb = data, repeat, items, cache_mb
        self.s3, self.out = s3, out
        self.root = data.parent / f"r{repeat}"
        self.root.mkdir()

    async def engine(self, url: str, options: dict[str, Any] | None = None) -> Engine:
        engine = Engine(settings(self.data, self.cache_mb, url, options or {}))
        await engine.start({"t": TableConfig()})
        return engine

    async def restore(
        self, name: str, url: str, items: int, options: dict[str, Any] | None = None
    ) -> float:
        """Seconds a new engine on an empty data dir takes to restore ``url``'s latest, which
        holds ``items`` items."""
        target = self.root / f"restored-{name}"
        engine = Engine(settings(target, self.cache_mb, url, options or {}, restore="latest"))
        took, _ = await timed(engine.start)
        try:
            got = engine.describe("t")["stats"]["size"]
        finally:
            await engine.stop()
        if got != items:
            raise RuntimeError(f"restore from {url} brought back {got} items, not {items}")
        await asyncio.to_thread(shutil.rmtree, target)
        return took

    async def fill(self) -> None:
        engine = await self.engine((self.root / "unused").as_uri())
        try:
            await push_random(engine, list(range(self.items)))
            await engine.flush()
        finally:
            await engine.stop()

    async def baselines(self) -> None:
        """Plain copies of the ``rocksdb`` folder, the engine stopped (compaction would
        delete files under a plain copy's feet; a snapshot copies hard links instead)."""
        source, copy = self.data / "rocksdb", self.root / "plain"
        self.out.add("bytes_plain", folder_bytes(source))
        took, _ = await timed(lambda: asyncio.to_thread(shutil.copytree, source, copy))
        self.out.add("copy_local", took)
        shutil.rmtree(copy)
        if self.s3 is not None:
            fs, remote = s3_filesystem(self.s3), f"{BUCKET}/plain-{self.repeat}"
            took, _ = await timed(lambda: asyncio.to_thread(fs.put, str(source), remote, True))
            self.out.add("copy_s3", took)
            took, _ = await timed(lambda: asyncio.to_thread(fs.get, remote, str(copy), True))
            self.out.add("back_s3", took)
            self.out.add("bytes_back_s3", folder_bytes(copy))
            shutil.rmtree(copy)
            await asyncio.to_thread(fs.rm, remote, True)

    @property
    def local_backup(self) -> Path:
        return self.root / "backup-local"

    async def local(self) -> None:
        """Snapshot to a folder and restore from it."""
        backup = self.local_backup
        url = backup.as_uri()
        engine = await self.engine(url)
        try:
            took, info = await timed(engine.take_snapshot)
            self.out.add("snap_local", took)
            self.out.add("bytes_snap", info.bytes)
            self.out.add("capture_local", snapshots_of(engine).last_capture_s or 0.0)
            copy = self.root / "plain-back"
            took, _ = await timed(
                lambda: asyncio.to_thread(shutil.copytree, backup / "files", copy)
            )
            self.out.add("back_local", took)
            self.out.add("bytes_back_local", folder_bytes(copy))
            shutil.rmtree(copy)
        finally:
            await engine.stop()
        self.out.add("restore_local", await self.restore("local", url, info.items))

    async def incremental(self) -> None:
        """Overwrite some items, then snapshot to the folder :meth:`local` filled."""
        engine = await self.engine(self.local_backup.as_uri())
        try:
            rng = random.Random(self.repeat)
            changed = rng.sample(range(self.items), int(self.items * CHANGED))
            await push_random(engine, changed)
            sent = snapshots_of(engine).bytes_uploaded
            took, info = await timed(engine.take_snapshot)
            self.out.add("incr_s", took)
            self.out.add("incr_sent", snapshots_of(engine).bytes_uploaded - sent)
            self.out.add("incr_total", info.bytes)
            self.out.add("incr_changed", len(changed) * VALUE_BYTES)
            self.out.add("incr_capture", snapshots_of(engine).last_capture_s or 0.0)
        finally:
            await engine.stop()
        shutil.rmtree(self.local_backup)

    async def pauses(self) -> None:
        """Push latency during a full snapshot to a folder, then with none for as long (after
        a warm-up, so one-off costs of a fresh engine land in neither)."""
        backup = self.root / "backup-pauses"
        engine = await self.engine(backup.as_uri())
        try:
            await push_latencies(engine, None, WARMUP_S)
            gc.collect()
            t0 = time.perf_counter()
            snapshot = asyncio.create_task(engine.take_snapshot())
            during, during_stall = await push_latencies(engine, snapshot, 0)
            await snapshot
            took = time.perf_counter() - t0
            capture = snapshots_of(engine).last_capture_s or 0.0
            gc.collect()
            idle, idle_stall = await push_latencies(engine, None, max(took, MIN_IDLE_S))
        finally:
            await engine.stop()
        shutil.rmtree(backup)
        for name, latencies, stall in (
            ("during", during, during_stall),
            ("idle", idle, idle_stall),
        ):
            self.out.add(f"{name}_stall", stall)
            self.out.add(f"{name}_n", len(latencies))
            self.out.add(f"{name}_p50", statistics.median(latencies))
            self.out.add(f"{name}_p99", p99(latencies))
            self.out.add(f"{name}_max", max(latencies))
        self.out.add("pause_snap_s", took)
        self.out.add("pause_capture", capture)

    async def s3_rows(self) -> None:
        """Snapshot to the S3 server and restore from it."""
        if self.s3 is None:
            return
        url = f"s3://{BUCKET}/snapshots-{self.repeat}"
        engine = await self.engine(url, self.s3)
        try:
            took, info = await timed(engine.take_snapshot)
            self.out.add("snap_s3", took)
            self.out.add("bytes_snap_s3", info.bytes)
            self.out.add("capture_s3", snapshots_of(engine).last_capture_s or 0.0)
        finally:
            await engine.stop()
        self.out.add("restore_s3", await self.restore("s3", url, info.items, self.s3))
        await asyncio.to_thread(s3_filesystem(self.s3).rm, url, True)


async def run(items: int, repeats: int) -> None:
    cache_mb = items * VALUE_BYTES / 4 / 2**20
    out = Samples()
    root = Path(tempfile.mkdtemp(prefix="bench-snapshots-"))
    try:
        with s3_server() as s3:
            for repeat in range(repeats):
                this = Run(root / "data", repeat, items=items, cache_mb=cache_mb, s3=s3, out=out)
                if repeat == 0:
                    await this.fill()
                await this.baselines()
                await this.local()
                await this.s3_rows()
                await this.incremental()
                await this.pauses()
                await asyncio.to_thread(shutil.rmtree, this.root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(out, items, repeats, cache_mb, s3_ran=s3 is not None)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def report(out: Samples, items: int, repeats: int, cache_mb: float, *, s3_ran: bool) -> None:
    size = items * VALUE_BYTES
    about = (
        f"{items:,} items of 64 KiB random values ({size / MB:,.0f} MB), hybrid, "
        f"cache {cache_mb:.0f} MiB; median of {repeats}"
    )
    snap_mb, s3_mb = out["bytes_snap"] / MB, out["bytes_snap_s3"] / MB
    plain_mb = out["bytes_plain"] / MB
    rows: list[list[Any]] = [
        [
            "local folder",
            f"{snap_mb:.0f} / {plain_mb:.0f}",
            out["snap_local"],
            snap_mb / out["snap_local"],
            out["copy_local"],
            plain_mb / out["copy_local"],
            ratio(out["snap_local"], out["copy_local"]),
            "≤ 2x",
        ]
    ]
    if s3_ran:
        rows.append(
            [
                "S3 (moto, in process)",
                f"{s3_mb:.0f} / {plain_mb:.0f}",
                out["snap_s3"],
                s3_mb / out["snap_s3"],
                out["copy_s3"],
                plain_mb / out["copy_s3"],
                ratio(out["snap_s3"], out["copy_s3"]),
                "≤ 2x",
            ]
        )
    print_table(
        f"Snapshot vs a plain copy of the rocksdb folder — {about}",
        ["to", "MB snap / copy", "snapshot s", "MB/s", "plain copy s", "MB/s", "ratio", "target"],
        rows,
    )
    back_mb = out["bytes_back_local"] / MB
    rows = [
        [
            "local folder",
            f"{snap_mb:.0f} / {back_mb:.0f}",
            out["restore_local"],
            snap_mb / out["restore_local"],
            out["back_local"],
            back_mb / out["back_local"],
            ratio(out["restore_local"], out["back_local"]),
            "≤ 2x",
        ]
    ]
    if s3_ran:
        back_mb = out["bytes_back_s3"] / MB
        rows.append(
            [
                "S3 (moto, in process)",
                f"{s3_mb:.0f} / {back_mb:.0f}",
                out["restore_s3"],
                s3_mb / out["restore_s3"],
                out["back_s3"],
                back_mb / out["back_s3"],
                ratio(out["restore_s3"], out["back_s3"]),
                "≤ 2x",
            ]
        )
    print_table(
        f"Restore (start() on an empty data dir) vs a plain copy back — {about}",
        [
            "from",
            "MB restore / copy",
            "restore s",
            "MB/s",
            "plain copy s",
            "MB/s",
            "ratio",
            "target",
        ],
        rows,
    )
    print_table(
        f"Incremental snapshot to a local folder after overwriting {CHANGED:.0%} of the items "
        f"— median of {repeats}",
        [
            "changed MB",
            "uploaded MB",
            "snapshot MB",
            "uploaded / snapshot",
            "time s",
            "full snapshot s",
            "writer pause ms",
        ],
        [
            [
                out["incr_changed"] / MB,
                out["incr_sent"] / MB,
                out["incr_total"] / MB,
                f"{out['incr_sent'] / out['incr_total']:.1%}",
                out["incr_s"],
                out["snap_local"],
                out["incr_capture"] * 1e3,
            ]
        ],
    )
    rows = []
    for name, label in (("idle", "no snapshot (baseline)"), ("during", "full snapshot to folder")):
        rows.append(
            [
                label,
                int(out[f"{name}_n"]),
                out[f"{name}_p50"] * 1e3,
                out[f"{name}_p99"] * 1e3,
                out[f"{name}_max"] * 1e3,
                out[f"{name}_stall"] * 1e3,
                out["pause_capture"] * 1e3 if name == "during" else "-",
                "< 50" if name == "during" else "-",
            ]
        )
    print_table(
        f"Push latency, one 4 KiB item at a time, over {out['pause_snap_s']:.1f} s — {about}",
        [
            "while",
            "pushes",
            "p50 ms",
            "p99 ms",
            "max ms",
            "loop stall max ms",
            "writer pause ms",
            "target max ms",
        ],
        rows,
    )


def main(argv: list[str] | None = None) -> None:
    """Prints the snapshot, restore, incremental and push-latency tables."""
    parser = argparse.ArgumentParser(prog="python -m bench.snapshots", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="~128 MB, one repeat")
    args = parser.parse_args(argv)
    size = (128 if args.quick else 1024) * 2**20
    asyncio.run(run(size // VALUE_BYTES, 1 if args.quick else 3))


if __name__ == "__main__":
    main()
