"""Downloading a snapshot into a folder: all files verified, or nothing in place.

Files land in a hidden staging folder beside the destination
(``.<name>.<random>.partial``), each hashed as it is written; only when every file matches
its manifest is the staging folder renamed to the destination (one rename on the same
filesystem), so a restore interrupted or refused half-way leaves the destination as it was.
A download that fails, or is asked to stop, removes its staging folder; one that a
``kill -9`` or a power cut ended leaves it behind, and :func:`remove_stale_downloads`
removes it at the next start.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from rlreplay.app.backup.checksums import copy_with_checksum
from rlreplay.app.backup.errors import SnapshotCorrupt
from rlreplay.app.backup.location import BackupLocation
from rlreplay.app.backup.manifest import Manifest, SnapshotFile
from rlreplay.app.backup.progress import ProgressInfo, ProgressTracker
from rlreplay.workers.transfer_pool import completed

__all__ = ["download_snapshot", "remove_stale_downloads", "stale_downloads"]

logger = logging.getLogger("rlreplay.backup")


def download_snapshot(
    location: BackupLocation,
    manifest: Manifest,
    dest_dir: Path,
    *,
    block_bytes: int,
    workers: int,
    progress: Callable[[ProgressInfo], None] | None,
    stop: threading.Event | None = None,
) -> None:
    """Download every file of ``manifest`` into ``dest_dir/<path>`` and verify it.

    Args:
        location: Where the snapshot's objects are.
        manifest: The snapshot.
        dest_dir: Must not exist, or be an empty folder.
        block_bytes: Size of one read from the backend.
        workers: Files downloaded at once.
        progress: Called in the calling thread after each verified file.
        stop: Set (from another thread) to stop the download within a block of each file
            in flight; what it downloaded is removed.

    Raises:
        FileExistsError: ``dest_dir`` exists and is not an empty folder.
        SnapshotCorrupt: A file is missing, or its size or checksum differs from the manifest.
        BackupUnavailable: The backend failed.
        TransferStopped: ``stop`` was set.
    """
    if dest_dir.exists() and (not dest_dir.is_dir() or any(dest_dir.iterdir())):
        raise FileExistsError(f"dest_dir {str(dest_dir)!r} exists and is not an empty folder")
    dest_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = dest_dir.parent / f"{_staging_prefix(dest_dir)}{secrets.token_hex(4)}.partial"
    staging.mkdir()
    try:
        tracker = ProgressTracker(len(manifest.files), manifest.bytes)

        def fetch(f: SnapshotFile) -> None:
            _fetch_file(location, manifest.id, f, staging / f.path, block_bytes, stop)

        for f, _ in completed(fetch, manifest.files, workers=workers):
            info = tracker.file_done(f.size)
            if progress is not None:
                progress(info)
        os.replace(staging, dest_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("snapshot %s downloaded to %s", manifest.id, dest_dir)


def _staging_prefix(dest_dir: Path) -> str:
    return f".{dest_dir.name}."


def stale_downloads(dest_dir: Path) -> list[Path]:
    """The staging folders that downloads into ``dest_dir`` left behind (a process killed
    mid-download: nothing else leaves one)."""
    if not dest_dir.parent.is_dir():
        return []
    prefix = _staging_prefix(dest_dir)
    return sorted(
        p
        for p in dest_dir.parent.iterdir()
        if p.name.startswith(prefix) and p.name.endswith(".partial") and p.is_dir()
    )


def remove_stale_downloads(dest_dir: Path) -> list[Path]:
    """Remove, saying so in the log, what :func:`stale_downloads` finds; those removed.
    Call it only while no download into ``dest_dir`` runs (at a server's start)."""
    stale = stale_downloads(dest_dir)
    for path in stale:
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        shutil.rmtree(path, ignore_errors=True)
        logger.warning(
            "removed %s (%.1f MB): a download that was interrupted (the process was "
            "killed during a restore)",
            path,
            size / 2**20,
        )
    return stale


def _fetch_file(
    location: BackupLocation,
    snapshot_id: str,
    f: SnapshotFile,
    target: Path,
    block_bytes: int,
    stop: threading.Event | None = None,
) -> None:
    """Copy one object to ``target``, hashing as it goes; ``SnapshotCorrupt`` on a mismatch."""
    target.parent.mkdir(parents=True, exist_ok=True)
    url = location.url_of(f.object)
    with target.open("wb") as dst:
        try:
            with (
                location.failing(f"downloading {f.object}"),
                location.open_object(f.object, block_bytes=block_bytes) as src,
            ):
                size, checksum = copy_with_checksum(src, dst, stop=stop)
        except FileNotFoundError as exc:
            raise SnapshotCorrupt(
                f"snapshot {snapshot_id}: file {f.path!r} is missing from the store ({url})"
            ) from exc
    if size != f.size or checksum != f.checksum:
        raise SnapshotCorrupt(
            f"snapshot {snapshot_id}: file {f.path!r} does not match its manifest: "
            f"expected checksum {f.checksum} ({f.size} bytes), "
            f"got checksum {checksum} ({size} bytes) from {url}"
        )
