"""The GPU sidecar: selection on the torch device, collection into host (pinned on CUDA)
memory, the change feed's cost on the push path, and a trainer's batches per second.

* Selection: :class:`rlreplay.gpu.selection.Selector` over 10^6 and 10^7 items (10^7 only
  without ``--quick``), batches of 256 and 4096, against the server's own CPU samplers and
  TorchRL's ``PrioritizedSampler`` (see :mod:`bench.torchrl_baseline`) in the same run.
  "after an update" rewrites 256 priorities first, so the draw rebuilds its prefix sum.
* Collection: :class:`rlreplay.gpu.collection.Collector` fetching distinct items from a
  live server (memory mode) into host memory, in GB/s, against a plain NumPy gather of the
  same bytes from an in-memory array, and the client's own ``get_many(layout="columns")``.
  "placing an answer" is the collector's own work (the columnar answer's bytes in hand,
  copied into host memory and on to the device); "fetch + place" adds the batchGet over
  HTTP, one at a time.
* Feed cost: committed pushes per second through the engine (memory mode, no log) into a
  table nobody follows and into one whose change feed is on.
* End to end: batches per second a training loop gets from ``ReplayDataset`` and from
  ``ReplayClient.stream(layout="columns")`` (+ ``as_torch``), 256 picks of 4 KiB.

Runs on the device torch picks (``cuda`` when present, else the CPU); the table says which.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.report import print_table
from bench.torchrl_baseline import median_us, torchrl_rows
from rlreplay.app.engine.engine import Engine
from rlreplay.app.selection.registry import make_selector
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.clients import ReplayClient
from rlreplay.gpu.collection import Collector
from rlreplay.gpu.dataset import ReplayDataset
from rlreplay.gpu.device_index import DeviceIndex
from rlreplay.gpu.sampler import GpuSampler
from rlreplay.gpu.selection import Selector
from tests.live import running_server

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


class _FilledIndex(DeviceIndex):
    """A device index of ``n`` live slots with random priorities, without their keys
    (selection never reads them)."""

    def __init__(self, n: int, rng: np.random.Generator) -> None:
        super().__init__(DEVICE, capacity=n)
        self.keys = [None] * n
        self._n = n
        self.live[:n] = True
        self.priority[:n] = torch.from_numpy(rng.uniform(0.01, 10.0, n)).to(DEVICE)
        self.inserted_at[:n] = torch.linspace(1.7e9 - 3600, 1.7e9, n, dtype=torch.float64)
        self.order[:n] = torch.arange(n, device=DEVICE)

    def __len__(self) -> int:
        return self._n


def sidecar_rows(n: int, batch: int, repeats: int, rng: np.random.Generator) -> list[list[Any]]:
    ix = _FilledIndex(n, rng)
    sel = Selector(ix)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    where = torch.from_numpy(rng.choice(n, 256, replace=False)).to(DEVICE)
    new = torch.from_numpy(rng.uniform(0.01, 10.0, 256)).to(DEVICE)

    def draw(strategy: Any) -> None:
        sel.select(batch, strategy, gen).slots.cpu()  # the host copy a draw makes

    def updated_draw() -> None:
        ix.set_priorities(where, new)  # the scatter a feed batch of 256 updates makes
        draw("prioritized")

    tag = f"sidecar ({DEVICE.type})"
    return [
        [f"{tag} prioritized", f"{n:,}", batch, median_us(lambda: draw("prioritized"), repeats)],
        [f"{tag} prioritized after an update", f"{n:,}", batch, median_us(updated_draw, repeats)],
        [f"{tag} uniform", f"{n:,}", batch, median_us(lambda: draw("uniform"), repeats)],
        [f"{tag} topk", f"{n:,}", batch, median_us(lambda: draw("topk"), repeats)],
    ]


def server_row(name: str, n: int, batch: int, repeats: int, rng: np.random.Generator) -> list[Any]:
    params = {"exponent": 0.6, "is_exponent": 0.4} if name == "prioritized" else {}
    server = make_selector(name, params)
    for start in range(0, n, 1_000_000):
        slots = np.arange(start, min(n, start + 1_000_000), dtype=np.int64)
        server.insert(slots, rng.uniform(0.01, 10.0, len(slots)), np.zeros(len(slots)))
    return [
        f"server {name} (numpy)",
        f"{n:,}",
        batch,
        median_us(lambda: server.sample(batch, rng), repeats),
    ]


def selection_rows(n: int, batch: int, repeats: int, rng: np.random.Generator) -> list[list[Any]]:
    rows = sidecar_rows(n, batch, repeats, rng)
    gc.collect()
    for name in ("prioritized", "uniform"):
        rows.append(server_row(name, n, batch, repeats, rng))
        gc.collect()
    for row in torchrl_rows(n, repeats, batch)[:1]:
        rows.append([row[0], f"{n:,}", batch, row[2]])
    return rows


@contextlib.contextmanager
def live_server(workdir: Path) -> Iterator[str]:
    flags = ("--storage-mode", "memory", "--durability", "none", "--max-request-mb", "256")
    with running_server(workdir, *flags, "--cache-memory-limit-mb", "4096") as live:
        yield live.url


async def fill(rb: ReplayClient, table: str, n: int, size: int) -> np.ndarray[Any, Any]:
    """``n`` items ``{"obs": uint8[size]}``; returns them as one (n, size) array."""
    await rb.create_table(table, sampler={"type": "uniform"})
    data = np.random.default_rng(1).integers(0, 255, (n, size), dtype=np.uint8)
    step = max(1, (8 << 20) // size)
    for start in range(0, n, step):
        keys = [f"{table}{i}" for i in range(start, min(n, start + step))]
        await rb.push_columns(table, keys, {"obs": data[start : start + len(keys)]}, wait=True)
    return data


async def collection_row(
    rb: ReplayClient, size: int, n: int, batch: int, repeats: int
) -> list[Any]:
    """GB/s of distinct ``batch`` picks of ``size``-byte items: the sidecar's Collector,
    the client's columnar get_many, and a NumPy gather of the same rows in memory."""
    table = f"c{size}"
    data = await fill(rb, table, n, size)
    rng = np.random.default_rng(2)
    picks = [rng.choice(n, batch, replace=False) for _ in range(repeats)]
    nbytes = batch * size
    collector = Collector(rb, table, DEVICE)

    async def timed(fn: Any) -> float:
        times = []
        for idx in picks:
            keys = [f"{table}{i}" for i in idx.tolist()]
            t0 = time.perf_counter()
            await fn(keys)
            _sync()
            times.append(time.perf_counter() - t0)
        return nbytes / statistics.median(times) / 1e9

    async def collect(keys: list[str]) -> None:
        await collector.collect(keys, None, ["obs"])

    async def client(keys: list[str]) -> None:
        (await rb.get_many(table, keys, layout="columns")).as_torch(DEVICE)

    # the collector's own work, the answer's bytes in hand: what the GPU's host side does
    answers = [await rb.get_many_packed(table, [f"{table}{i}" for i in idx]) for idx in picks]
    placing = []
    for packed in answers:
        t0 = time.perf_counter()
        collector.place(packed, None, ["obs"])
        _sync()
        placing.append(time.perf_counter() - t0)
    place_gbs = nbytes / statistics.median(placing) / 1e9

    out = np.empty((batch, size), dtype=np.uint8)
    gathers = []
    for idx in picks:
        t0 = time.perf_counter()
        np.take(data, idx, axis=0, out=out)
        gathers.append(time.perf_counter() - t0)
    numpy_gbs = nbytes / statistics.median(gathers) / 1e9
    sidecar_gbs = await timed(collect)
    client_gbs = await timed(client)
    await rb.drop_table(table)
    label = f"{size // 1024} KiB x {batch}"
    return [
        label,
        place_gbs,
        place_gbs / numpy_gbs,
        sidecar_gbs,
        client_gbs,
        numpy_gbs,
        sidecar_gbs / numpy_gbs,
    ]


async def collection_rows(url: str, repeats: int) -> list[list[Any]]:
    async with ReplayClient(url, timeout_s=120) as rb:
        return [
            await collection_row(rb, 4096, 4096, 512, repeats),
            await collection_row(rb, 400 * 1024, 256, 32, repeats),
        ]


async def feed_cost_rows(repeats: int) -> list[list[Any]]:
    rates: dict[str, list[float]] = {"nobody follows": [], "a follower (feed on)": []}
    items = [NewItem(f"k{i}", b"\x91\x01" * 50, 1.0) for i in range(64 * 300)]
    for _ in range(repeats):
        for label in rates:
            with tempfile.TemporaryDirectory() as data:
                eng = Engine(
                    Settings(data_dir=Path(data), storage_mode="memory", durability="none")
                )
                await eng.start()
                await eng.create_table("t", TableConfig())
                if label != "nobody follows":
                    eng._table("t").follow(eng.settings.changes_keep)
                t0 = time.perf_counter()
                for start in range(0, len(items), 64):
                    await eng.push("t", items[start : start + 64], wait=True)
                rates[label].append(len(items) / (time.perf_counter() - t0))
                await eng.stop()
    base = statistics.median(rates["nobody follows"])
    return [[k, statistics.median(v), statistics.median(v) / base] for k, v in rates.items()]


def end_to_end_rows(url: str, seconds: float) -> list[list[Any]]:
    async def setup() -> None:
        async with ReplayClient(url, timeout_s=120) as rb:
            await fill(rb, "e2e", 4096, 4096)

    asyncio.run(setup())
    rows = []
    dataset = ReplayDataset(
        url, "e2e", batch_size=256, fields=["obs"], device=DEVICE, seed=0, prefetch=4
    )
    with dataset.iterate() as batches:
        next(batches)
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            next(batches)
            done += 1
        rows.append([f"ReplayDataset ({DEVICE.type})", done / (time.perf_counter() - t0)])

    async def stream() -> float:
        async with ReplayClient(url, timeout_s=120) as rb:
            done, t0 = -1, 0.0
            async for batch in rb.stream("e2e", batch_size=256, prefetch=4, layout="columns"):
                batch.as_torch(DEVICE, non_blocking=True)
                done += 1
                if done == 0:
                    t0 = time.perf_counter()
                elif time.perf_counter() - t0 >= seconds:
                    break
            return done / (time.perf_counter() - t0)

    rows.append(["ReplayClient.stream(layout='columns') + as_torch", asyncio.run(stream())])
    base = rows[1][1]
    return [[name, rate, rate / base] for name, rate in rows]


async def propagation_ms(url: str, rounds: int) -> float:
    """Median milliseconds from an answered priority update to a following sampler that
    has applied it (its long poll wakes on the event)."""
    async with ReplayClient(url) as rb, GpuSampler(rb, "e2e", device=DEVICE) as sampler:
        times = []
        for i in range(rounds):
            before = sampler.follower.events_applied
            t0 = time.perf_counter()
            await rb.update_priorities("e2e", {"e2e0": 1.0 + i})
            while sampler.follower.events_applied == before:  # noqa: ASYNC110 - timing a poll
                await asyncio.sleep(0.0002)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sidecar", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10^6 items only, fewer repeats")
    args = parser.parse_args(argv)
    repeats = 21 if args.quick else 101
    torch.set_num_threads(1)  # as the TorchRL baseline; the server's sampler uses one core
    rng = np.random.default_rng(0)
    rows = []
    for n in [1_000_000] + ([] if args.quick else [10_000_000]):
        for batch in (256, 4096):
            rows += selection_rows(n, batch, repeats, rng)
    print_table(
        f"Sidecar selection on {DEVICE.type} (median of {repeats} draws)",
        ["selector", "items", "batch", "draw (µs)"],
        rows,
    )
    with tempfile.TemporaryDirectory() as workdir, live_server(Path(workdir)) as url:
        collected = asyncio.run(collection_rows(url, 9 if args.quick else 31))
        print_table(
            f"Sidecar collection into host memory ({DEVICE.type}; pinned on CUDA), GB/s",
            [
                "items x batch",
                "placing an answer",
                "vs numpy",
                "fetch + place",
                "client get_many",
                "numpy gather",
                "vs numpy",
            ],
            collected,
        )
        e2e = end_to_end_rows(url, 3.0 if args.quick else 10.0)
        lag_ms = asyncio.run(propagation_ms(url, 21))
    print_table(
        "Change feed cost on the push path (engine, 64-item pushes, committed items/s)",
        ["table", "items/s", "vs nobody"],
        asyncio.run(feed_cost_rows(3 if args.quick else 7)),
    )
    print_table(
        "Trainer batches/s (256 picks x 4 KiB, one field)",
        ["source", "batches/s", "vs stream()"],
        e2e,
    )
    print_table(
        "Change propagation (median of 21)",
        ["from", "to", "ms"],
        [["priority update answered", "applied by a following GpuSampler", lag_ms]],
    )


if __name__ == "__main__":
    main()
