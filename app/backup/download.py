"""Downloading a snapshot into a folder: all files verified, or nothing in place.

Files land in a hidden staging folder beside the destination, each hashed as it is written;
only when every file matches its manifest is the staging folder renamed to the destination
(one rename on the same filesystem), so a restore interrupted or refused half-way leaves the
destination as it was.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

from rlreplay.app.backup.checksums import copy_with_checksum
from rlreplay.app.backup.errors import SnapshotCorrupt
from rlreplay.app.backup.location import BackupLocation
from rlreplay.app.backup.manifest import Manifest, SnapshotFile
from rlreplay.app.backup.pool import completed
from rlreplay.app.backup.progress import ProgressInfo, ProgressTracker

__all__ = ["download_snapshot"]

logger = logging.getLogger("rlreplay.backup")


def download_snapshot(
    location: BackupLocation,
    manifest: Manifest,
    dest_dir: Path,
    *,
    block_bytes: int,
    workers: int,
    progress: Callable[[ProgressInfo], None] | None,
) -> None:
    """Download every file of ``manifest`` into ``dest_dir/<path>`` and verify it.

    Args:
        location: Where the snapshot's objects are.
        manifest: The snapshot.
        dest_dir: Must not exist, or be an empty folder.
        block_bytes: Size of one read from the backend.
        workers: Files downloaded at once.
        progress: Called in the calling thread after each verified file.

    Raises:
        FileExistsError: ``dest_dir`` exists and is not an empty folder.
        SnapshotCorrupt: A file is missing, or its size or checksum differs from the manifest.
        BackupUnavailable: The backend failed.
    """
    if dest_dir.exists() and (not dest_dir.is_dir() or any(dest_dir.iterdir())):
        raise FileExistsError(f"dest_dir {str(dest_dir)!r} exists and is not an empty folder")
    dest_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = dest_dir.parent / f".{dest_dir.name}.{secrets.token_hex(4)}.partial"
    staging.mkdir()
    try:
        tracker = ProgressTracker(len(manifest.files), manifest.bytes)

        def fetch(f: SnapshotFile) -> None:
            _fetch_file(location, manifest.id, f, staging / f.path, block_bytes)

        for f, _ in completed(fetch, manifest.files, workers=workers):
            info = tracker.file_done(f.size)
            if progress is not None:
                progress(info)
        os.replace(staging, dest_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("snapshot %s downloaded to %s", manifest.id, dest_dir)


def _fetch_file(
    location: BackupLocation, snapshot_id: str, f: SnapshotFile, target: Path, block_bytes: int
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
                size, checksum = copy_with_checksum(src, dst)
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
