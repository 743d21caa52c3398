"""Prometheus metrics of one app, in a registry of its own (never the process-global one).

Request metrics are recorded by :class:`rlreplay.app.api.middleware.RequestContextMiddleware`;
per-table figures and queue depths are read from the engine at scrape time by
:class:`EngineExposition`, so they cost nothing between scrapes.

A scrape runs on the event loop, so it is kept cheap however many tables there are:

* Every table counts in the ``rlreplay_all_tables_*`` totals, but only the largest
  ``max_tables`` (``--metrics-max-tables``) get ``rlreplay_table_*{table=...}`` series.
* The engine's part is written as text directly: prometheus_client's metric objects and
  their formatting cost microseconds per series, which made most of a scrape's time.
* The rendered answer is reused for ``cache_s`` (``--metrics-cache-s``), so scrapers that
  come together share one render.

``python -m bench.metrics`` measures a scrape at 10, 1,000 and 5,000 tables.
"""

from __future__ import annotations

import math
import time
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from rlreplay.app.tables.stats import STAT_NAMES, TablesSummary
from rlreplay.wire.errors import Unavailable

__all__ = ["CONTENT_TYPE", "EngineExposition", "EngineView", "Metrics"]

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

#: Each stat of :data:`rlreplay.app.tables.table.STAT_NAMES`: (metric name, type, help). Counters'
#: names have their ``_total``; the totals over every table are ``rlreplay_all_tables_*``.
_TABLE_STATS: dict[str, tuple[str, str, str]] = {
    "size": ("rlreplay_table_items", "gauge", "Items in the table, pending writes included."),
    "pending_ops": (
        "rlreplay_table_pending_ops",
        "gauge",
        "Accepted ops the writer has not applied.",
    ),
    "bytes_in_cache": (
        "rlreplay_table_bytes_in_cache",
        "gauge",
        "Bytes of the table's items in RAM.",
    ),
    "bytes_on_disk": (
        "rlreplay_table_bytes_on_disk",
        "gauge",
        "Bytes of the table's items on disk.",
    ),
    "inserts": ("rlreplay_table_inserts_total", "counter", "Items inserted into the table."),
    "samples": ("rlreplay_table_samples_total", "counter", "Items sampled from the table."),
    "deletes": ("rlreplay_table_deletes_total", "counter", "Items deleted from the table."),
    "evictions_to_disk": (
        "rlreplay_table_evictions_to_disk_total",
        "counter",
        "Items evicted from RAM to disk.",
    ),
    "populates": (
        "rlreplay_table_populates_total",
        "counter",
        "Items read back from disk into RAM.",
    ),
}

#: The kinds of ``rlreplay_recovery_data_lost_total``, exported at 0 until one happens.
DATA_LOSS_KINDS = (
    "checkpoint_damaged",
    "checkpoint_missing",
    "log_damaged",
    "log_missing",
    "log_record",
)

#: Engine-wide figures exposed as gauges: stat name -> (metric name, help).
_STORAGE_GAUGES = {
    "cache_bytes": ("rlreplay_cache_bytes", "Bytes of items held in RAM."),
    "cache_limit_bytes": ("rlreplay_cache_limit_bytes", "The RAM cache's limit in bytes."),
    "cache_entries": ("rlreplay_cache_entries", "Items held in RAM."),
    "wal_bytes": ("rlreplay_wal_bytes", "Bytes of the write-ahead log on disk."),
    "applied_ops": ("rlreplay_writer_applied_ops", "Ops the writer has applied since start."),
    "recovered_records": ("rlreplay_recovered_records", "Log records replayed at start."),
    "writer_alive": ("rlreplay_writer_alive", "1 while the writer runs; 0 once it has died."),
    "storage_failing": (
        "rlreplay_storage_failing",
        "1 while writes to disk fail (the log, checkpoints, evictions): a full disk, I/O errors.",
    ),
}


def _head(name: str, kind: str, doc: str) -> str:
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


def _stat_series() -> tuple[list[tuple[str, str]], dict[str, str]]:
    """``(total's name, per-table name)`` of each stat in :data:`STAT_NAMES` order, and the
    ``# HELP``/``# TYPE`` lines of each name."""
    series, heads = [], {}
    for stat in STAT_NAMES:
        name, kind, doc = _TABLE_STATS[stat]
        total = name.replace("rlreplay_table_", "rlreplay_all_tables_", 1)
        heads[total] = _head(total, kind, f"Summed over every table: {doc[0].lower()}{doc[1:]}")
        heads[name] = _head(name, kind, doc)
        series.append((total, name))
    return series, heads


_STAT_SERIES, _HEADS = _stat_series()


class EngineView(Protocol):
    """What the exposition reads from the engine (a subset of
    :class:`rlreplay.app.engine.Engine`)."""

    def tables_summary(self, largest: int | None) -> TablesSummary:
        """Every table's stats summed, and those of the ``largest`` biggest (all: None)."""
        ...

    def queue_depths(self) -> dict[str, int]:
        """Ops waiting in each write queue."""
        ...

    def storage_stats(self) -> dict[str, Any]:
        """Engine-wide figures: cache bytes and limit, log bytes, applied ops."""
        ...


def _value(x: float) -> str:
    """A sample value as the text format spells it (``1.0``, ``1e+16``, ``+Inf``, ``NaN``)."""
    x = float(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(x)


def _label(text: str) -> str:
    """A label value, escaped as the text format asks (table names never need it)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class EngineExposition:
    """The engine's figures in the Prometheus text format, read at each scrape.

    Series: ``rlreplay_tables`` and ``rlreplay_tables_exported`` (how many tables there are
    and how many have series of their own); each table stat summed over every table
    (``rlreplay_all_tables_items``, ``rlreplay_all_tables_inserts_total``...; the counters
    keep the counts of dropped tables, so they never go down); the same stats per table
    (``rlreplay_table_items{table="..."}``...) for the ``max_tables`` largest tables (most
    items; equal sizes in creation order), every table when None; the write queues'
    depths; the cache, log and writer figures.
    """

    def __init__(self, engine: EngineView, *, max_tables: int | None) -> None:
        """Reads from ``engine``; ``max_tables`` caps the tables with series of their own."""
        if max_tables is not None and max_tables < 0:
            raise ValueError(f"max_tables ({max_tables}) must be >= 0 or None")
        self._engine = engine
        self.max_tables = max_tables

    def render(self) -> str:
        """The engine's part of a scrape."""
        out: list[str] = []
        try:
            summary: TablesSummary | None = self._engine.tables_summary(self.max_tables)
        except Unavailable:  # still recovering: no table figures yet
            summary = None
        if summary is not None:
            out.append(_head("rlreplay_tables", "gauge", "Tables in the engine."))
            out.append(f"rlreplay_tables {_value(summary.tables)}\n")
            out.append(
                _head(
                    "rlreplay_tables_exported",
                    "gauge",
                    "Tables with rlreplay_table_* series of their own: the largest, up to "
                    "--metrics-max-tables.",
                )
            )
            out.append(f"rlreplay_tables_exported {_value(len(summary.largest))}\n")
            labels = [f'{{table="{_label(name)}"}} ' for name, _ in summary.largest]
            for i, (total, name) in enumerate(_STAT_SERIES):
                out.append(f"{_HEADS[total]}{total} {_value(summary.totals[i])}\n")
                out.append(_HEADS[name])
                out.extend(
                    f"{name}{label}{_value(values[i])}\n"
                    for label, (_, values) in zip(labels, summary.largest, strict=True)
                )
        out.append(
            _head(
                "rlreplay_write_queue_depth",
                "gauge",
                "What waits in the writer's queues: ops by queue, item ops, bytes held.",
            )
        )
        for queue, depth in self._engine.queue_depths().items():
            out.append(f'rlreplay_write_queue_depth{{queue="{_label(queue)}"}} {_value(depth)}\n')
        try:
            storage = self._engine.storage_stats()
        except Unavailable:
            storage = {}
        for stat, (name, doc) in _STORAGE_GAUGES.items():
            if isinstance(storage.get(stat), int | float):
                out.append(_head(name, "gauge", doc) + f"{name} {_value(storage[stat])}\n")
        failures = storage.get("failures")
        if isinstance(failures, dict) and failures:
            out.append(
                _head(
                    "rlreplay_storage_failures_total",
                    "counter",
                    "Storage writes that failed, by kind (log_flush, checkpoint, evict, store); "
                    "background ones are retried with backoff.",
                )
            )
            for kind, count in failures.items():
                out.append(
                    f'rlreplay_storage_failures_total{{kind="{_label(kind)}"}} {_value(count)}\n'
                )
        lost = storage.get("data_lost")
        if isinstance(lost, dict):
            out.append(
                _head(
                    "rlreplay_recovery_data_lost_total",
                    "counter",
                    "Missing or damaged data the start went past (--accept-data-loss, "
                    "--wal-recovery point-in-time), by kind; each is logged.",
                )
            )
            for kind in sorted({*DATA_LOSS_KINDS, *lost}):
                out.append(
                    f'rlreplay_recovery_data_lost_total{{kind="{_label(kind)}"}} '
                    f"{_value(lost.get(kind, 0))}\n"
                )
        out.extend(_snapshot_series(getattr(self._engine, "snapshot_stats", None)))
        out.extend(_recovery_series(getattr(self._engine, "recovery", None)))
        out.extend(_checkpoint_series(getattr(self._engine, "checkpoint_stats", None)))
        task_stats = getattr(self._engine, "task_stats", None)
        if callable(task_stats):
            out.extend(_task_series(task_stats()))
        reservation_stats = getattr(self._engine, "reservation_stats", None)
        if callable(reservation_stats):
            out.extend(_reservation_series(reservation_stats()))
        lag = getattr(self._engine, "writer_lag_s", None)
        if isinstance(lag, int | float):
            out.append(
                _head(
                    "rlreplay_writer_lag_seconds",
                    "gauge",
                    "Age of the oldest op the writer has not applied.",
                )
                + f"rlreplay_writer_lag_seconds {_value(lag)}\n"
            )
        return "".join(out)


_SNAPSHOT_SERIES = {
    "snapshots_total": ("counter", "Snapshots uploaded to the backup URL."),
    "snapshot_failures_total": ("counter", "Snapshots that failed (capture or upload)."),
    "snapshot_uploaded_bytes_total": (
        "counter",
        "Bytes uploaded by snapshots (files the backup URL already had are not sent again).",
    ),
    "snapshot_last_success_time": ("gauge", "Unix time of the last snapshot that succeeded."),
    "snapshot_newest_age_seconds": ("gauge", "Age of the newest snapshot at the backup URL."),
    "snapshot_last_capture_seconds": (
        "gauge",
        "How long the writer paused to capture the last snapshot (the upload runs after).",
    ),
}


#: :class:`~rlreplay.app.writer.checkpoints.CheckpointStats` field -> (name, type, help).
_CHECKPOINT_SERIES = {
    "checkpoints": ("rlreplay_checkpoints_total", "counter", "Checkpoints taken since start."),
    "seconds_total": (
        "rlreplay_checkpoint_seconds_total",
        "counter",
        "Seconds spent in checkpoints since start.",
    ),
    "last_seconds": ("rlreplay_checkpoint_last_seconds", "gauge", "The last checkpoint's time."),
    "longest_seconds": (
        "rlreplay_checkpoint_duration_max_seconds",
        "gauge",
        "The longest checkpoint since start.",
    ),
    "bytes_total": (
        "rlreplay_checkpoint_bytes_total",
        "counter",
        "Bytes checkpoints wrote (RocksDB keys and values, or memory.ckpt) since start.",
    ),
    "last_bytes": ("rlreplay_checkpoint_last_bytes", "gauge", "Bytes the last checkpoint wrote."),
    "last_loop_stall_s": (
        "rlreplay_checkpoint_loop_stall_last_seconds",
        "gauge",
        "The longest the event loop went without a turn during the last checkpoint.",
    ),
    "longest_loop_stall_s": (
        "rlreplay_checkpoint_loop_stall_max_seconds",
        "gauge",
        "The longest the event loop went without a turn during any checkpoint since start.",
    ),
    "recovery_s": (
        "rlreplay_recovery_seconds",
        "gauge",
        "Seconds the start took to bring the tables back (storage, log replay, checkpoint).",
    ),
    "replay_bytes_s": (
        "rlreplay_recovery_replay_bytes_per_second",
        "gauge",
        "Bytes of log a restart replays per second (measured at a start, else assumed).",
    ),
    "replay_bytes": (
        "rlreplay_recovery_replay_bytes",
        "gauge",
        "Bytes of log a restart now would replay (as of the writer's last op).",
    ),
    "recovery_bound_s": (
        "rlreplay_recovery_bound_seconds",
        "gauge",
        "The bound on replaying the log that checkpoints keep (--recovery-bound-s; 0: none).",
    ),
}


def _checkpoint_series(stats: Any) -> list[str]:
    """The ``rlreplay_checkpoint*`` and ``rlreplay_recovery_*`` figures of the writer."""
    if stats is None:
        return []
    out = []
    for field, (name, kind, doc) in _CHECKPOINT_SERIES.items():
        out.append(_head(name, kind, doc) + f"{name} {_value(getattr(stats, field))}\n")
    return out


def _task_series(stats: dict[str, dict[str, dict[str, int]]]) -> list[str]:
    """Per table and consumer task of rollout tables: items ready and leased (gauges),
    acknowledgements and lease expiries (counters)."""
    if not stats:
        return []
    out = [
        _head(
            "rlreplay_task_items",
            "gauge",
            "Items of a rollout table by consumer task and state (ready, leased).",
        )
    ]
    rows = [
        (f'table="{_label(table)}",task="{_label(task)}"', counts)
        for table, tasks in stats.items()
        for task, counts in tasks.items()
    ]
    for labels, counts in rows:
        for state in ("ready", "leased"):
            out.append(f'rlreplay_task_items{{{labels},state="{state}"}} {_value(counts[state])}\n')
    for name, stat, doc in (
        ("rlreplay_task_acked_total", "acked", "Items a consumer task acknowledged."),
        ("rlreplay_task_expired_total", "expired", "Leased items released by lease expiry."),
    ):
        out.append(_head(name, "counter", doc))
        out.extend(f"{name}{{{labels}}} {_value(counts[stat])}\n" for labels, counts in rows)
    return out


_RESERVATION_SERIES = (
    ("rlreplay_reserved_slots", "gauge", "reserved", "Reserved slots no push filled yet."),
    ("rlreplay_reservation_slots_granted_total", "counter", "granted", "Slots granted."),
    ("rlreplay_reservation_slots_filled_total", "counter", "filled", "Slots filled by pushes."),
    (
        "rlreplay_reservation_slots_returned_total",
        "counter",
        "returned",
        "Unfilled slots returned (by DELETE or expiry).",
    ),
    ("rlreplay_items_expired_total", "counter", "expired", "Items deleted past ttl_s."),
    (
        "rlreplay_expiry_failures_total",
        "counter",
        "failures",
        "Expiry sweeps that failed (each is logged).",
    ),
)


def _reservation_series(stats: dict[str, dict[str, int]]) -> list[str]:
    """Per table with reservations or ``ttl_s``: slots reserved, granted, filled and
    returned, items expired, and failed expiry sweeps."""
    out: list[str] = []
    if not stats:
        return out
    for name, kind, stat, doc in _RESERVATION_SERIES:
        out.append(_head(name, kind, doc))
        out.extend(
            f'{name}{{table="{_label(table)}"}} {_value(counts.get(stat, 0))}\n'
            for table, counts in stats.items()
        )
    return out


def _snapshot_series(stats: Any) -> list[str]:
    """The ``rlreplay_snapshot*`` series (none without a backup URL)."""
    figures = stats() if callable(stats) else None
    if not isinstance(figures, dict):
        return []
    out = []
    for stat, (kind, doc) in _SNAPSHOT_SERIES.items():
        if stat in figures:
            name = f"rlreplay_{stat}"
            out.append(_head(name, kind, doc) + f"{name} {_value(figures[stat])}\n")
    return out


def _recovery_series(recovery: Any) -> list[str]:
    """``rlreplay_recovery_progress_ratio`` and ``rlreplay_recovery_done{phase,unit}`` of the
    start-up's phases (``restore``: bytes downloaded; ``replay``: log records applied)."""
    phases = getattr(recovery, "phases", None)
    if not isinstance(phases, dict) or not phases:
        return []
    ratios = [(phase, p.ratio) for phase, p in phases.items() if p.ratio is not None]
    out = [
        _head(
            "rlreplay_recovery_progress_ratio",
            "gauge",
            "How far each phase of the start-up is, 0 to 1 (restore: the snapshot's bytes "
            "downloaded; replay: the log's records applied); 1 once done.",
        )
    ]
    out.extend(
        f'rlreplay_recovery_progress_ratio{{phase="{_label(phase)}"}} {_value(ratio)}\n'
        for phase, ratio in ratios
    )
    out.append(
        _head(
            "rlreplay_recovery_done",
            "gauge",
            "Work each phase of the start-up has done, in its unit (B or records).",
        )
    )
    out.extend(
        f'rlreplay_recovery_done{{phase="{_label(phase)}",unit="{_label(p.unit)}"}} '
        f"{_value(p.done)}\n"
        for phase, p in phases.items()
    )
    return out


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

    def __init__(self, *, cache_s: float = 0.0) -> None:
        """Creates a fresh registry with the request metrics in it.

        Args:
            cache_s: Seconds :meth:`render` answers with its last rendering (0: never).
        """
        if cache_s < 0:
            raise ValueError(f"cache_s ({cache_s}) must be >= 0")
        self.cache_s = cache_s
        self.engine: EngineExposition | None = None
        self._rendered = b""
        self._rendered_at = -float("inf")
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

    def watch_engine(self, engine: EngineView, *, max_tables: int | None) -> None:
        """Adds the figures of ``engine`` to each scrape (see :class:`EngineExposition`).

        Args:
            engine: The engine.
            max_tables: How many tables (the largest) get series of their own; all: None.
        """
        self.engine = EngineExposition(engine, max_tables=max_tables)

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
        """The Prometheus text exposition: the request metrics, then the engine's figures.

        A rendering younger than ``cache_s`` is answered again as it is.
        """
        now = time.monotonic()
        if now - self._rendered_at < self.cache_s:
            return self._rendered
        body = generate_latest(self.registry)
        if self.engine is not None:
            body += self.engine.render().encode()
        self._rendered, self._rendered_at = body, now
        return body
