"""The event loop's time per ``GET /metrics`` scrape at 10, 1,000 and 5,000 tables.

Run as ``python -m bench.metrics [--quick]``. An in-process app (``rlreplay serve``'s
defaults: hybrid storage, the log on) gets the tables, each with 0 to 15 items, and a few
requests of each kind so the request metrics have series; then each scrape is one call of
the ASGI app: what the server's event loop spends on it, less uvicorn's HTTP parsing. The
figures are medians of the loop thread's CPU time (on a shared machine, wall time also
counts the other processes' turns; the default arm's wall time is shown too). Arms, in
the same run on the same app:

* before: the exporter this release replaced, every table through prometheus_client's
  metric objects and ``Engine.describe`` (kept here as the baseline);
* every table: the current exporter with ``--metrics-max-tables none``;
* largest 100: the default cap, each scrape rendered (``--metrics-cache-s 0``);
* cached: the defaults, a scrape that comes within a second of the last one.

A second table is the issue's symptom at 5,000 tables: push latency (64 items of 1 KiB,
``wait`` false, acknowledged once in the log) on the loop that also serves two scrapers,
each scraping back to back, with no scraper, every table, the cap alone, and the defaults
(cap and cache).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import msgpack
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from bench.report import print_table
from rlreplay.app.engine.engine import Engine
from rlreplay.app.main import create_app
from rlreplay.app.metrics import Metrics
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem

TABLES = (10, 1_000, 5_000)
CAP = 100
MIN_PUSHES = 2  # per push-latency run, however long it takes
PUSH_BODY = msgpack.packb(
    {"items": [{"key": f"k{i}", "value": b"x" * 1024, "priority": 1.0} for i in range(64)]}
)
HEADERS = [
    "tables",
    "before",
    "every table",
    f"largest {CAP}",
    "cached",
    f"before / largest {CAP}",
    f"largest {CAP}, wall",
    "body before / now (KiB)",
]


async def call(app: FastAPI, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request through the ASGI app, as uvicorn would make it: (status, body)."""
    headers = [(b"host", b"bench"), (b"content-length", str(len(body)).encode())]
    if body:
        headers.append((b"content-type", b"application/msgpack"))
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    messages = iter([{"type": "http.request", "body": body, "more_body": False}])
    status, chunks = 0, []

    async def receive() -> dict[str, Any]:
        return next(messages, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        else:
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


BEFORE_GAUGES = {
    "size": "rlreplay_table_items",
    "pending_ops": "rlreplay_table_pending_ops",
    "bytes_in_cache": "rlreplay_table_bytes_in_cache",
    "bytes_on_disk": "rlreplay_table_bytes_on_disk",
}
BEFORE_COUNTERS = {
    "inserts": "rlreplay_table_inserts",
    "samples": "rlreplay_table_samples",
    "deletes": "rlreplay_table_deletes",
    "evictions_to_disk": "rlreplay_table_evictions_to_disk",
    "populates": "rlreplay_table_populates",
}


class BeforeCollector:
    """The exporter this release replaced: every table's ``describe()`` into metric objects
    (help texts aside; the queue and storage gauges, a few series, left out)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        gauges = {s: GaugeMetricFamily(n, n, labels=["table"]) for s, n in BEFORE_GAUGES.items()}
        counters = {
            s: CounterMetricFamily(n, n, labels=["table"]) for s, n in BEFORE_COUNTERS.items()
        }
        for table in self.engine.table_names():
            stats = self.engine.describe(table)["stats"]
            for stat, family in gauges.items():
                family.add_metric([table], float(stats[stat]))
            for stat, cfamily in counters.items():
                cfamily.add_metric([table], float(stats[stat]))
        yield from gauges.values()
        yield from counters.values()


@contextmanager
def arm(metrics: Metrics, *, cap: int | None, cache_s: float) -> Iterator[None]:
    """Serves ``/metrics`` with this cap and cache for a while."""
    exposition = metrics.engine
    assert exposition is not None
    saved = exposition.max_tables, metrics.cache_s
    exposition.max_tables, metrics.cache_s = cap, cache_s
    try:
        yield
    finally:
        exposition.max_tables, metrics.cache_s = saved


@contextmanager
def before(metrics: Metrics, engine: Engine) -> Iterator[None]:
    """Serves ``/metrics`` with the exporter this release replaced, for a while."""
    registry = CollectorRegistry()
    registry.register(BeforeCollector(engine))

    def render() -> bytes:
        return generate_latest(metrics.registry) + generate_latest(registry)

    with mock.patch.object(metrics, "render", render):
        yield


async def time_scrapes(app: FastAPI, repeats: int) -> tuple[float, float, int]:
    """Median wall and thread-CPU ms of one scrape, and the body's bytes."""
    walls, cpus, size = [], [], 0
    await call(app, "GET", "/metrics")  # a first scrape fills the cache, where there is one
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.thread_time()
        status, body = await call(app, "GET", "/metrics")
        cpus.append(time.thread_time() - c0)
        walls.append(time.perf_counter() - w0)
        assert status == 200, body[:200]
        size = len(body)
    return statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3, size


async def fill(app: FastAPI, engine: Engine, n: int) -> None:
    """``n`` tables in all (``default`` included), table i with i * 7 % 16 items."""
    config = TableConfig.model_validate({"sampler": {"type": "uniform"}})
    names = [f"t{i:05d}" for i in range(1, n)]
    for start in range(0, len(names), 256):
        await asyncio.gather(*(engine.create_table(t, config) for t in names[start : start + 256]))
    pushes = [
        engine.push(name, [NewItem(f"k{j}", b"\xa1x", 1.0) for j in range(i * 7 % 16)])
        for i, name in enumerate(names)
        if i * 7 % 16
    ]
    for start in range(0, len(pushes), 256):  # concurrent: they share the log's fsyncs
        await asyncio.gather(*pushes[start : start + 256])
    for path in ("/healthz", "/readyz", "/v1/tables/default", "/v1/tables/nope"):
        await call(app, "GET", path)
    await call(app, "POST", "/v1/tables/default/items", PUSH_BODY)
    await call(app, "POST", "/v1/tables/default/sample", msgpack.packb({"batch_size": 8}))


async def push_latency(
    app: FastAPI, seconds: float, scrapers: int
) -> tuple[float, float, int, int]:
    """Push latency (median and max ms) while ``scrapers`` tasks scrape back to back for
    ``seconds`` (and at least :data:`MIN_PUSHES` pushes); the pushes and scrapes done."""
    stop = asyncio.Event()
    scrapes = 0

    async def scrape() -> None:
        nonlocal scrapes
        while not stop.is_set():
            await call(app, "GET", "/metrics")
            scrapes += 1
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(scrape()) for _ in range(scrapers)]
    latencies = []
    try:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or len(latencies) < MIN_PUSHES:
            t0 = time.perf_counter()
            status, body = await call(app, "POST", "/v1/tables/default/items", PUSH_BODY)
            latencies.append(time.perf_counter() - t0)
            assert status == 202, body[:200]
            await asyncio.sleep(0.001)  # a pusher at up to ~1,000 pushes/s, not a busy loop
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    return statistics.median(latencies) * 1e3, max(latencies) * 1e3, len(latencies), scrapes


async def measure(
    n: int, repeats: int, push_s: float, data: Path
) -> tuple[list[Any], list[list[Any]]]:
    """The scrape row at ``n`` tables; at the largest size also the push-latency rows."""
    settings = Settings(
        data_dir=data, metrics_cache_s=1.0, metrics_max_tables=CAP, max_tables=n + 1
    )
    app = create_app(settings)
    engine: Engine = app.state.engine
    metrics: Metrics = app.state.metrics
    latency_rows: list[list[Any]] = []
    async with app.router.lifespan_context(app):
        await fill(app, engine, n)
        with before(metrics, engine):
            _, old, old_bytes = await time_scrapes(app, max(3, repeats // 4))
        with arm(metrics, cap=None, cache_s=0):
            _, every, _ = await time_scrapes(app, repeats)
        with arm(metrics, cap=CAP, cache_s=0):
            largest_wall, largest, largest_bytes = await time_scrapes(app, repeats)
        _, cached, _ = await time_scrapes(app, repeats)  # the defaults
        if push_s:
            runs: list[tuple[str, Callable[[], AbstractContextManager[None]], int]] = [
                ("no scraper", lambda: arm(metrics, cap=CAP, cache_s=1.0), 0),
                ("every table, no cache", lambda: arm(metrics, cap=None, cache_s=0), 2),
                (f"largest {CAP}, no cache", lambda: arm(metrics, cap=CAP, cache_s=0), 2),
                ("defaults", lambda: arm(metrics, cap=CAP, cache_s=1.0), 2),
            ]
            for label, context, scrapers in runs:
                with context():
                    t0 = time.perf_counter()
                    p50, worst, pushes, scrapes = await push_latency(app, push_s, scrapers)
                    took = time.perf_counter() - t0
                latency_rows.append([label, scrapers, pushes, p50, worst, scrapes / took])
    row = [
        f"{n:,}",
        old,
        every,
        largest,
        cached,
        f"{old / largest:.0f}x",
        largest_wall,
        f"{old_bytes / 1024:.0f} / {largest_bytes / 1024:.0f}",
    ]
    return row, latency_rows


async def run(sizes: tuple[int, ...], repeats: int, push_s: float) -> None:
    rows, latency_rows = [], []
    for n in sizes:
        data = Path(tempfile.mkdtemp(prefix="bench-metrics-"))
        try:
            row, latency = await measure(n, repeats, push_s if n == max(sizes) else 0, data)
        finally:
            shutil.rmtree(data, ignore_errors=True)
        rows.append(row)
        latency_rows += latency
    title = (
        f"/metrics scrape: event-loop CPU ms per scrape (median of {repeats}; "
        f"before: of {max(3, repeats // 4)})"
    )
    print_table(title, HEADERS, rows)
    if latency_rows:
        print_table(
            f"Push latency, scrapers back to back, {max(sizes):,} tables ({push_s:g} s each)",
            [
                "/metrics served by",
                "scrapers",
                "pushes",
                "push p50 (ms)",
                "push max (ms)",
                "scrapes/s",
            ],
            latency_rows,
        )


def main(argv: list[str] | None = None) -> None:
    """Prints the scrape table and the push-latency table; ``--quick`` scrapes fewer times."""
    parser = argparse.ArgumentParser(prog="python -m bench.metrics", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer scrapes, shorter push runs")
    parser.add_argument("--repeats", type=int, default=21, help="timed scrapes per median")
    parser.add_argument("--push-s", type=float, default=1.0, help="seconds per push-latency run")
    args = parser.parse_args(argv)
    repeats = 9 if args.quick else args.repeats
    push_s = 0.5 if args.quick else args.push_s
    asyncio.run(run(TABLES, repeats, push_s))


if __name__ == "__main__":
    main()
