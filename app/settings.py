"""Settings of the service, read from flags and ``RLREPLAY_*`` environment variables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

StorageMode = Literal["memory", "disk", "hybrid"]
Durability = Literal["wal", "none"]
#: The names ``--log-level`` takes (``trace`` is uvicorn's, below ``debug``).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


class Settings(BaseSettings):
    """Every setting of ``rlreplay serve``; each is also ``RLREPLAY_<NAME>`` in the environment.

    Built once by the CLI (flags beat variables) and passed to ``create_app``; never a
    module global.
    """

    model_config = SettingsConfigDict(env_prefix="RLREPLAY_", extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind.")
    uds: Path | None = Field(
        None,
        description=(
            "Also serve on this Unix domain socket (mode 0660; a stale one is replaced, "
            "the file removed at stop); clients use unix:///path."
        ),
    )
    tcp: bool = Field(
        True, description="Serve on host:port (--no-tcp with --uds: the socket only)."
    )
    data_dir: Path = Field(Path("./data"), description="RocksDB and the write-ahead log live here.")
    storage_mode: StorageMode = Field("hybrid", description="memory, disk or hybrid.")
    cache_memory_limit_mb: float = Field(
        1024, gt=0, description="Bytes of items (keys, values, overhead) kept in RAM."
    )
    durability: Durability = Field(
        "wal", description="wal: answered writes survive kill -9; none: write-back, may lose."
    )
    wal_checkpoint_mb: float = Field(
        1024,
        gt=0,
        description=(
            "Checkpoint (flush to RocksDB, truncate the log) past this log size at the "
            "latest (--recovery-bound-s usually calls for one sooner); hybrid keeps up to "
            "about 3x this (values pushed since the last checkpoint)."
        ),
    )
    recovery_bound_s: float = Field(
        30,
        ge=0,
        description=(
            "Checkpoint sooner than --wal-checkpoint-mb when replaying the log after a crash "
            "would take longer than this (the log's replay rate measured); 0: no bound."
        ),
    )
    log_loop_stalls_ms: float = Field(
        0,
        ge=0,
        description=(
            "A diagnostic: log a warning with the event loop thread's stack whenever the "
            "loop goes this long without a turn (every request waits that long); 0: off."
        ),
    )
    wal_writer: Literal["auto", "process", "thread"] = Field(
        "auto",
        description=(
            "Where log flushes run: a log writer process (no GIL hand-overs), a thread, or "
            "auto: a thread, then the process once the log is busy."
        ),
    )
    wal_group_commit_ms: float = Field(
        0.0, ge=0, description="Extra wait to gather more writes into one fsync (0: none)."
    )
    write_queue_ops: int = Field(
        100_000, gt=0, description="Item ops the write queue holds before 503 overloaded."
    )
    write_queue_mb: float = Field(
        512, gt=0, description="Bytes of values the write queue holds before 503 overloaded."
    )
    urgent_probability: float = Field(
        0.8, ge=0, le=1, description="Chance the writer takes urgent ops over housekeeping."
    )
    io_threads: int = Field(4, gt=0, description="Threads for blocking RocksDB and file I/O.")
    backup_url: str | None = Field(
        None,
        description=(
            "fsspec URL that snapshots go to (s3://bucket/prefix, gs://..., hdfs://..., "
            "file:///path, memory://name); none: no snapshots."
        ),
    )
    backup_interval_s: float = Field(
        180, ge=0, description="Seconds between periodic snapshots (0: on demand only)."
    )
    backup_keep: int = Field(5, gt=0, description="Snapshots kept at the backup URL.")
    backup_storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "fsspec storage options as JSON (an S3 endpoint, credentials); S3 also reads "
            "the usual AWS_* variables."
        ),
    )
    restore: str = Field(
        "none",
        description=(
            "On start, before /readyz: latest, a snapshot id, or none. A data dir with data "
            "of its own is kept (latest) or refused (an id) unless --restore-replace."
        ),
    )
    restore_replace: bool = Field(
        False,
        description=(
            "With --restore: replace the data dir's own data with the snapshot (the old "
            "files are moved aside to replaced-<time>/, not deleted)."
        ),
    )
    max_request_mb: float = Field(64, gt=0, description="Largest request body accepted.")
    zstd: bool = Field(
        False,
        description=(
            "Content-Encoding: zstd: compress answers of 16 KiB and more for clients that "
            "send Accept-Encoding: zstd, and read zstd request bodies (for slow links)."
        ),
    )
    max_response_mb: float = Field(
        256,
        gt=0,
        description=(
            "Largest answer built: a sample, batchGet or claim whose items (keys and values as "
            "stored) would take more is refused with 422 before it is built."
        ),
    )
    stop_timeout_s: float = Field(
        10,
        gt=0,
        description=(
            "On SIGTERM, how long the writer may take to apply what is queued before it is "
            "stopped anyway (what it leaves is in the log)."
        ),
    )
    max_tables: int = Field(
        1024, gt=0, le=1_000_000, description="Tables the server holds at most (507 past it)."
    )
    wal_recovery: Literal["strict", "point-in-time"] = Field(
        "strict",
        description=(
            "strict: damage in the log (a segment missing or damaged, a gap, a record that "
            "cannot be applied) stops the start, naming it; point-in-time: replay ends at the "
            "first hole or damage (later segments are set aside as *.skipped) and a record "
            "that cannot be applied is skipped, logged (a checkpoint missing or damaged still "
            "needs --accept-data-loss)."
        ),
    )
    accept_data_loss: bool = Field(
        False,
        description=(
            "Start even when the data on disk cannot give back everything answered (a log "
            "segment or a checkpoint missing or damaged): what is whole is loaded, the log "
            "replayed past holes and damaged bytes, and each thing dropped is logged and "
            "counted in rlreplay_recovery_data_lost_total. Without it such a start exits "
            "with status 3, naming the damage."
        ),
    )
    request_head_timeout_s: float = Field(
        10,
        gt=0,
        allow_inf_nan=False,
        description="Seconds a client has to send a whole request head, else it is disconnected.",
    )
    request_body_timeout_s: float = Field(
        30,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Window over which a request body's pace is checked: a client whose body brings "
            "less than --request-body-min-kb-per-s (and at least a byte) over a window is "
            "disconnected."
        ),
    )
    request_body_min_kb_per_s: float = Field(
        1,
        ge=0,
        allow_inf_nan=False,
        description="Slowest mean pace of a request body over each window, in KiB/s.",
    )
    keep_alive_s: float = Field(
        30, gt=0, allow_inf_nan=False, description="Seconds an idle keep-alive connection stays."
    )
    max_connections: int = Field(
        2048, gt=0, description="Open connections past which new ones are closed at once."
    )
    api_key: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Bearer keys; when set, /v1 needs one."
    )
    metrics_require_key: bool = Field(
        False, description="With API keys set, /metrics needs one too (health checks stay open)."
    )
    metrics_max_tables: int | None = Field(
        100,
        ge=0,
        description=(
            "Tables with series of their own in /metrics, the largest first (none: every "
            "table); every table counts in the rlreplay_all_tables_* totals."
        ),
    )
    metrics_cache_s: float = Field(
        1.0, ge=0, description="Seconds a rendered /metrics answer is reused (0: render each)."
    )
    default_table: bool = Field(True, description="Create the table 'default' at start-up.")
    default_table_max_size: int | None = Field(
        None, gt=0, description="max_size of the 'default' table (none: unbounded)."
    )
    default_sampler: str = Field("uniform", description="Sampler type of the 'default' table.")
    changes_keep: int = Field(
        1_000_000,
        gt=0,
        description="Change events kept for the GPU sidecar's feed (not implemented yet).",
    )
    hot_routes: bool = Field(
        True,
        description=(
            "Serve push, batchGet, batchDelete, priorities and sample on the hot path, "
            "past Starlette's routing (off: every request goes through FastAPI; the same "
            "answers, for comparison in the benchmark)."
        ),
    )
    log_level: str = Field("info", description=f"Logging level: {', '.join(LOG_LEVELS)}.")
    seed: int | None = Field(
        None, ge=0, description="Seed of the samplers' and removers' random draws (none: fresh)."
    )

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.strip().lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"unknown log level {value!r}; one of {', '.join(LOG_LEVELS)}")
        return level

    @field_validator("api_key", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [k for k in text.replace(",", " ").split() if k]
        return value

    @property
    def cache_limit_bytes(self) -> int:
        """``cache_memory_limit_mb`` in bytes."""
        return int(self.cache_memory_limit_mb * 1024 * 1024)
