"""Snapshots: every table captured at one point of the writer's order, uploaded to the
backup URL in the background, and restored from there on start.

A snapshot is a :class:`~rlreplay.app.writer.ops.SnapshotOp` on the writer's urgent queue, so
it has a precise place among the ops: the writer captures the tables into a folder of the
data directory (RocksDB's checkpoint of hard links, or memory mode's checkpoint file) and
goes on; the upload (:class:`~rlreplay.app.backup.BackupStore`: content-addressed files, so
only new ones travel, and a manifest written last) runs in threads of its own. One snapshot
runs at a time: a request that comes while one runs waits for it and gets its answer.
Failures are logged and counted and never stop the service; periodic snapshots retry with
backoff.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from rlreplay.app.backup import (
    BackupError,
    BackupStore,
    Manifest,
    ProgressInfo,
    SnapshotCorrupt,
    TransferStopped,
)
from rlreplay.app.backup import (
    SnapshotNotFound as NoSnapshot,
)
from rlreplay.app.backup.download import remove_stale_downloads
from rlreplay.app.log.in_use import IN_USE
from rlreplay.app.progress import Progress, RecoveryProgress
from rlreplay.app.settings import Settings
from rlreplay.app.storage.faults import Backoff
from rlreplay.app.writer.memory_checkpoint import MEMORY_CHECKPOINT
from rlreplay.app.writer.ops import SnapshotOp
from rlreplay.app.writer.state import EngineState
from rlreplay.app.writer.task_processor import TaskProcessor
from rlreplay.wire.errors import NotConfigured, TableNotFound, Unavailable
from rlreplay.workers.blocking import BlockingIO

log = logging.getLogger("rlreplay.snapshots")

STAGING = "snapshots"  # the data dir's folder for captures waiting for their upload
RESTORING = ".restoring"  # where a restore downloads before its files take their places
_UPLOAD_THREADS = 2  # uploads get threads of their own: RocksDB's calls never wait for them


class _Abandoned(Exception):
    """Raised in the upload's thread, between files, once the server is stopping."""


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A complete snapshot, as the API answers it."""

    id: str
    url: str
    created_at: float
    items: int
    bytes: int
    tables: list[str]


class Snapshots:
    """Takes snapshots through the writer, uploads them, lists them; owns the periodic task.

    Lifetime: :meth:`start` (after the engine's recovery) starts periodic snapshots when
    ``--backup-interval-s`` is above 0; :meth:`stop` (idempotent) cancels them and waits
    for an upload in flight to end.
    """

    def __init__(self, settings: Settings, processor: TaskProcessor, state: EngineState) -> None:
        self._settings = settings
        self._processor = processor
        self._state = state
        self._store: BackupStore | None = None
        if settings.backup_url:
            options = {**BackupStore.options_from_env(), **settings.backup_storage_options}
            self._store = BackupStore(settings.backup_url, storage_options=options)
        self._io = BlockingIO(threads=_UPLOAD_THREADS)
        self._running: asyncio.Task[SnapshotInfo] | None = None
        self._periodic: asyncio.Task[None] | None = None
        self._retry = Backoff(most_s=max(1.0, settings.backup_interval_s))
        self._stopping = threading.Event()  # an upload in flight gives up at its next file
        #: figures for /metrics
        self.failures = 0
        self.taken = 0
        self.bytes_uploaded = 0
        self.last_success_at: float | None = None  # unix time
        self.newest_created_at: float | None = None  # unix time of the newest at the URL
        self.last_capture_s: float | None = None  # the writer's pause for the last capture
        self.last_error: str | None = None

    @property
    def configured(self) -> bool:
        """Whether the server has a backup URL."""
        return self._store is not None

    def _backup(self) -> BackupStore:
        if self._store is None:
            raise NotConfigured("snapshots need a backup URL: start the server with --backup-url")
        return self._store

    async def start(self) -> None:
        """Start periodic snapshots (when configured with an interval above 0)."""
        staging = self._settings.data_dir / STAGING  # captures a crash left behind
        await self._io.run(shutil.rmtree, staging, ignore_errors=True)
        if self._store is not None and self._settings.backup_interval_s > 0:
            if self._periodic is None:
                loop = asyncio.get_running_loop()
                self._periodic = loop.create_task(self._every_interval(), name="rlreplay-backup")

    async def stop(self) -> None:
        """Stop periodic snapshots; an upload in flight gives up after the files it is
        sending (its snapshot is never listed: its manifest is not written); idempotent."""
        self._stopping.set()
        periodic, self._periodic = self._periodic, None
        if periodic is not None:
            periodic.cancel()
            await asyncio.gather(periodic, return_exceptions=True)
        running = self._running
        if running is not None:
            await asyncio.gather(running, return_exceptions=True)
        self._io.close()

    # -- taking ---------------------------------------------------------------------------

    async def take(self, tables: Sequence[str] | None = None) -> SnapshotInfo:
        """Take a snapshot and return once its manifest is written.

        Args:
            tables: Restore only these tables from it (all: None); each must exist.
                While a snapshot runs, a call waits for it and gets its answer.

        Raises:
            NotConfigured: No backup URL.
            TableNotFound: ``tables`` names a table that does not exist.
            StorageFull, Unavailable: The capture or the upload failed.
        """
        self._backup()
        if tables is not None:
            have = self._state.tables
            missing = [t for t in tables if t not in have or have[t].dropping]
            if missing:
                raise TableNotFound(f"no table {missing[0]!r} to snapshot")
        if self._running is None or self._running.done():
            self._running = asyncio.get_running_loop().create_task(
                self._take(list(tables) if tables is not None else None),
                name="rlreplay-snapshot",
            )
        return await asyncio.shield(self._running)

    async def _take(self, tables: list[str] | None) -> SnapshotInfo:
        store = self._backup()
        snapshot_id = store.new_id()
        dest = self._settings.data_dir / STAGING / snapshot_id
        try:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            op = SnapshotOp(0, future=fut, weight=0, dest=dest)
            began = time.monotonic()
            self._processor.submit(op)
            await fut
            self.last_capture_s = time.monotonic() - began
            meta: dict[str, Any] = dict(op.meta)
            if tables is not None:
                shown = meta["tables"]
                meta["tables"] = {name: shown[name] for name in tables if name in shown}
                meta["only_tables"] = tables
            meta["items"] = sum(int(t["items"]) for t in meta["tables"].values())
            uploading = Progress(f"snapshot {snapshot_id} upload", None, log=log)
            try:
                result = await self._io.run(
                    store.upload,
                    dest,
                    meta,
                    snapshot_id=snapshot_id,
                    progress=partial(self._go_on, uploading),
                )
                await self._io.run(store.prune, self._settings.backup_keep)
            except BackupError as exc:
                raise Unavailable(f"snapshot {snapshot_id}: {exc}") from exc
            except _Abandoned as exc:
                raise Unavailable(f"snapshot {snapshot_id}: the server is stopping") from exc
            finally:
                uploading.close(summary=False)  # the line below says what the upload did
        except BaseException as exc:
            self.failures += 1
            self.last_error = f"{snapshot_id}: {exc}"
            log.error("snapshot %s failed: %s", snapshot_id, exc)
            raise
        finally:
            await self._io.run(shutil.rmtree, dest, ignore_errors=True)
        manifest = result.manifest
        self.taken += 1
        self.bytes_uploaded += result.uploaded_bytes
        self.last_success_at = time.time()
        self.newest_created_at = manifest.created_at
        log.info(
            "snapshot %s: %d items, %d files (%d new, %.1f MB uploaded), writer paused %.3f s",
            manifest.id,
            meta["items"],
            len(manifest.files),
            result.uploaded_files,
            result.uploaded_bytes / 2**20,
            self.last_capture_s or 0.0,
        )
        return self._info(manifest)

    def _go_on(self, shown: Progress, sent: int, total: int) -> None:
        """The upload's progress callback (in its thread): show it; stop between files on
        stop()."""
        if shown.total != total:
            shown.set_total(total)
        shown.advance_to(sent)
        if self._stopping.is_set():
            raise _Abandoned

    async def _every_interval(self) -> None:
        """Periodic snapshots; a failure is logged (in :meth:`_take`) and retried sooner."""
        interval = self._settings.backup_interval_s
        wait = interval
        while True:
            await asyncio.sleep(wait)
            try:
                await self.take()
            except asyncio.CancelledError:
                raise
            except Exception:  # counted and logged by _take; the service goes on
                self._retry.failed()
                wait = min(interval, max(0.0, self._retry.next_try - time.monotonic()))
            else:
                self._retry.succeeded()
                wait = interval

    # -- listing --------------------------------------------------------------------------

    async def list(self) -> list[SnapshotInfo]:
        """The complete snapshots at the backup URL, newest first."""
        store = self._backup()
        try:
            manifests = await self._io.run(store.list)
        except BackupError as exc:
            raise Unavailable(f"the backup URL cannot be listed: {exc}") from exc
        if manifests:
            self.newest_created_at = manifests[0].created_at
        return [self._info(m) for m in manifests]

    def _info(self, manifest: Manifest) -> SnapshotInfo:
        return SnapshotInfo(
            id=manifest.id,
            url=self._backup().manifest_url(manifest.id),
            created_at=manifest.created_at,
            items=int(manifest.meta.get("items", 0)),
            bytes=manifest.bytes,
            tables=sorted(manifest.meta.get("tables", {})),
        )

    def stats(self) -> dict[str, float]:
        """Figures for ``/metrics``."""
        out: dict[str, float] = {
            "snapshots_total": self.taken,
            "snapshot_failures_total": self.failures,
            "snapshot_uploaded_bytes_total": self.bytes_uploaded,
        }
        if self.last_success_at is not None:
            out["snapshot_last_success_time"] = self.last_success_at
        if self.newest_created_at is not None:
            out["snapshot_newest_age_seconds"] = max(0.0, time.time() - self.newest_created_at)
        if self.last_capture_s is not None:
            out["snapshot_last_capture_seconds"] = self.last_capture_s
        return out


# -- restoring ----------------------------------------------------------------------------


class RestoreRefused(RuntimeError):
    """``--restore`` cannot be done as asked; the message says why and what to do."""


def _own_data(data_dir: Path) -> list[Path]:
    """The data directory's own tables: RocksDB or memory mode's checkpoint file."""
    found = [data_dir / "rocksdb", data_dir / MEMORY_CHECKPOINT]
    return [
        p
        for p in found
        if (p / "CURRENT").exists() or (p.is_file() and p.name == MEMORY_CHECKPOINT)
    ]


def _compatible(snapshot_mode: str, mode: str) -> bool:
    """Whether a server in ``mode`` can start from files taken in ``snapshot_mode``
    (hybrid and disk share RocksDB's layout; memory mode has its own file)."""
    return (snapshot_mode == "memory") == (mode == "memory")


def restore_on_start(
    settings: Settings,
    recovery: RecoveryProgress | None = None,
    stop: threading.Event | None = None,
) -> Manifest | None:
    """``--restore``: put a snapshot's files in the data directory before recovery reads it
    (blocking: the engine runs it in an I/O thread). A write-ahead log left in the data
    directory past the snapshot's position is then replayed on top by the recovery.

    Returns the restored snapshot's manifest, or None when nothing was restored (``latest``
    with no snapshot at the URL yet starts empty, so a deployment can always ask for it).
    The download's progress goes to ``recovery``'s ``restore`` phase (a bar or log lines).
    Setting ``stop`` (the server is stopping) ends the download at its next block and
    removes it. Every start first removes, with a warning, what a restore killed half-way
    left in the data directory.

    Raises:
        RestoreRefused: No backup URL; a snapshot id named while the data dir has data of
            its own (without ``--restore-replace``); no usable snapshot; a snapshot taken
            in an incompatible storage mode.
    """
    which = settings.restore.strip()
    data_dir = settings.data_dir
    _remove_stale_restore(data_dir)
    if which == "none":
        return None
    if not settings.backup_url:
        raise RestoreRefused(f"--restore {which} needs --backup-url")
    data_dir.mkdir(parents=True, exist_ok=True)
    own = _own_data(data_dir)
    if own and not settings.restore_replace:
        if which == "latest":
            log.warning(
                "restore: %s has data of its own; starting from it, not from a snapshot "
                "(--restore-replace replaces it)",
                data_dir,
            )
            return None
        raise RestoreRefused(
            f"--restore {which}: {data_dir} has data of its own ({own[0].name}); "
            "--restore-replace moves it aside and restores the snapshot"
        )
    options = {**BackupStore.options_from_env(), **settings.backup_storage_options}
    store = BackupStore(settings.backup_url, storage_options=options)
    staging = data_dir / RESTORING
    shutil.rmtree(staging, ignore_errors=True)
    began = time.monotonic()
    log.info("restore: looking for snapshot %s at %s", which, settings.backup_url)
    try:
        if which == "latest" and not store.list():
            # a first start on an empty bucket: nothing to restore yet (an unreachable
            # bucket raises instead, and so does one whose snapshots are all damaged)
            log.warning("restore: no snapshot at %s yet; starting empty", settings.backup_url)
            return None
        with (recovery or RecoveryProgress()).start("restore", None, log=log, unit="B") as shown:
            manifest = store.restore(which, staging, progress=_follow(shown), stop=stop)
    except TransferStopped as exc:
        log.warning("restore: stopped, as the server is stopping; its download was removed")
        raise RestoreRefused(
            f"--restore {which}: stopped, as the server is stopping (what it downloaded "
            "was removed)"
        ) from exc
    except NoSnapshot as exc:
        raise RestoreRefused(f"--restore {which}: {exc}") from exc
    except SnapshotCorrupt as exc:
        raise RestoreRefused(f"--restore {which}: refused, {exc}") from exc
    except BackupError as exc:
        raise RestoreRefused(f"--restore {which}: the backup URL failed: {exc}") from exc
    snapshot_mode = str(manifest.meta.get("mode", "hybrid"))
    if not _compatible(snapshot_mode, settings.storage_mode):
        shutil.rmtree(staging, ignore_errors=True)
        raise RestoreRefused(
            f"snapshot {manifest.id} was taken in {snapshot_mode} mode; a "
            f"{settings.storage_mode} server cannot start from it (use --storage-mode "
            f"{snapshot_mode})"
        )
    if own:
        aside = data_dir / f"replaced-{time.strftime('%Y%m%dT%H%M%S')}"
        aside.mkdir()
        for path in [*own, data_dir / "wal", data_dir / IN_USE]:
            if path.exists():
                path.rename(aside / path.name)
        log.warning("restore: the data dir's own data moved to %s", aside)
    for entry in staging.iterdir():
        entry.rename(data_dir / entry.name)
    staging.rmdir()
    log.info(
        "restore: snapshot %s (%d files, %.1f MB, log position %s) in place after %.1f s",
        manifest.id,
        len(manifest.files),
        manifest.bytes / 2**20,
        manifest.meta.get("lsn"),
        time.monotonic() - began,
    )
    return manifest


def _remove_stale_restore(data_dir: Path) -> None:
    """Remove what a restore killed half-way left in ``data_dir``: a partial download, or
    a whole one that was not yet moved into place (the next restore downloads again)."""
    remove_stale_downloads(data_dir / RESTORING)
    staging = data_dir / RESTORING
    if staging.exists():
        shutil.rmtree(staging, ignore_errors=True)
        log.warning(
            "restore: removed %s, a download that a stopped restore did not put in place",
            staging,
        )


def _follow(shown: Progress) -> Callable[[ProgressInfo], None]:
    """The download's callback, moving ``shown`` along."""

    def on_file(info: ProgressInfo) -> None:
        if shown.total != info.bytes_total:  # "latest" went on to an older snapshot
            shown.set_total(info.bytes_total)
        shown.advance_to(info.bytes_done)

    return on_file
