"""Prometheus metrics of one app, in a registry of its own (never the process-global one).

Request metrics are recorded by :class:`app.api.middleware.RequestContextMiddleware`;
per-table figures and queue depths are read from the engine at scrape time by
:class:`EngineCollector`, so they cost nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from clients.errors import TableNotFound, Unavailable

__all__ = ["CONTENT_TYPE", "EngineCollector", "EngineView", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

#: Table stats exposed as gauges: stat name -> (metric name, help).
_TABLE_GAUGES = {
    "size": ("rlreplay_table_items", "Items in the table, pending writes included."),
    "pending_ops": ("rlreplay_table_pending_ops", "Accepted ops the writer has not applied."),
    "bytes_in_cache": ("rlreplay_table_bytes_in_cache", "Bytes of the table's items in RAM."),
    "bytes_on_disk": ("rlreplay_table_bytes_on_disk", "Bytes of the table's items on disk."),
}
#: Table stats exposed as counters (their ``_total`` is added by the exposition).
_TABLE_COUNTERS = {
    "inserts": ("rlreplay_table_inserts", "Items inserted into the table."),
    "samples": ("rlreplay_table_samples", "Items sampled from the table."),
    "deletes": ("rlreplay_table_deletes", "Items deleted from the table."),
    "evictions_to_disk": ("rlreplay_table_evictions_to_disk", "Items evicted from RAM to disk."),
    "populates": ("rlreplay_table_populates", "Items read back from disk into RAM."),
}

#: Engine-wide figures exposed as gauges: stat name -> (metric name, help).
_STORAGE_GAUGES = {
    "cache_bytes": ("rlreplay_cache_bytes", "Bytes of items held in RAM."),
    "cache_limit_bytes": ("rlreplay_cache_limit_bytes", "The RAM cache's limit in bytes."),
    "cache_entries": ("rlreplay_cache_entries", "Items held in RAM."),
    "wal_bytes": ("rlreplay_wal_bytes", "Bytes of the write-ahead log on disk."),
    "applied_ops": ("rlreplay_writer_applied_ops", "Ops the writer has applied since start."),
    "recovered_records": ("rlreplay_recovered_records", "Log records replayed at start."),
}


class EngineView(Protocol):
    """What the collector reads from the engine (a subset of :class:`app.engine.Engine`)."""

    def table_names(self) -> list[str]:
        """Names of the tables."""
        ...

    def describe(self, name: str) -> dict[str, object]:
        """``{"name", "config", "stats"}`` of one table."""
        ...

    def queue_depths(self) -> dict[str, int]:
        """Ops waiting in each write queue."""
        ...

    def storage_stats(self) -> dict[str, Any]:
        """Engine-wide figures: cache bytes and limit, log bytes, applied ops."""
        ...


class EngineCollector(Collector):
    """Reads per-table stats and queue depths from the engine at each scrape."""

    def __init__(self, engine: EngineView) -> None:
        """Collects from ``engine``."""
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        """Yields the gauges and counters of every table, then the queue depths."""
        gauges = {
            stat: GaugeMetricFamily(name, doc, labels=["table"])
            for stat, (name, doc) in _TABLE_GAUGES.items()
        }
        counters = {
            stat: CounterMetricFamily(name, doc, labels=["table"])
            for stat, (name, doc) in _TABLE_COUNTERS.items()
        }
        try:
            names = self._engine.table_names()
        except Unavailable:  # still recovering: no table figures yet
            names = []
        for table in names:
            try:
                stats = self._engine.describe(table).get("stats", {})
            except TableNotFound:  # dropped between the listing and the read
                continue
            if not isinstance(stats, dict):
                continue
            for stat, family in gauges.items():
                if isinstance(stats.get(stat), int | float):
                    family.add_metric([table], float(stats[stat]))
            for stat, cfamily in counters.items():
                if isinstance(stats.get(stat), int | float):
                    cfamily.add_metric([table], float(stats[stat]))
        yield from gauges.values()
        yield from counters.values()
        queues = GaugeMetricFamily(
            "rlreplay_write_queue_depth",
            "What waits in the writer's queues: ops in p0 and p1, item ops and bytes held.",
            labels=["queue"],
        )
        for queue, depth in self._engine.queue_depths().items():
            queues.add_metric([queue], float(depth))
        yield queues
        try:
            storage = self._engine.storage_stats()
        except Unavailable:
            storage = {}
        for stat, (name, doc) in _STORAGE_GAUGES.items():
            if isinstance(storage.get(stat), int | float):
                yield GaugeMetricFamily(name, doc, value=float(storage[stat]))
        lag = getattr(self._engine, "writer_lag_s", None)
        if isinstance(lag, int | float):
            yield GaugeMetricFamily(
                "rlreplay_writer_lag_seconds",
                "Age of the oldest op the writer has not applied.",
                value=float(lag),
            )


_M = TypeVar("_M", Counter, Histogram)


def _child(cache: dict[tuple[str, ...], _M], metric: _M, *labels: str) -> _M:
    """``metric.labels(*labels)``, looked up in ``cache`` first."""
    child = cache.get(labels)
    if child is None:
        child = cache[labels] = metric.labels(*labels)
    return child


class Metrics:
    """The metrics of one app: request latency, ops and items by kind, engine figures.

    The labelled children are looked up once per label set and kept in plain dicts:
    ``labels()`` takes a lock and builds a key on every call, which per request adds up.
    """

    def __init__(self) -> None:
        """Creates a fresh registry with the request metrics in it."""
        self.registry = CollectorRegistry()
        self.request_seconds = Histogram(
            "rlreplay_http_request_duration_seconds",
            "Time to answer an HTTP request, by route template, method and status.",
            ["route", "method", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ops = Counter(
            "rlreplay_ops",
            "API operations by kind (route name) and outcome (ok or the error code).",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.items = Counter(
            "rlreplay_items",
            "Items handled by the API, by kind of op.",
            ["kind"],
            registry=self.registry,
        )
        self._latency: dict[tuple[str, ...], Histogram] = {}
        self._ops: dict[tuple[str, ...], Counter] = {}
        self._items: dict[tuple[str, ...], Counter] = {}

    def watch_engine(self, engine: EngineView) -> None:
        """Adds the per-table and queue figures of ``engine`` to the registry."""
        self.registry.register(EngineCollector(engine))

    def observe_request(
        self,
        *,
        route: str,
        method: str,
        status: int,
        seconds: float,
        op: str | None,
        error_code: str | None,
    ) -> None:
        """Records one answered request."""
        code = str(status)
        _child(self._latency, self.request_seconds, route, method, code).observe(seconds)
        if op is not None:
            outcome = error_code or ("ok" if status < 400 else code)
            _child(self._ops, self.ops, op, outcome).inc()

    def count_items(self, kind: str, n: int) -> None:
        """Adds ``n`` items handled by an op of ``kind`` (push, sample, get...)."""
        if n:
            _child(self._items, self.items, kind).inc(n)

    def render(self) -> bytes:
        """The Prometheus text exposition of the registry."""
        return generate_latest(self.registry)
