"""The snapshot store: incremental uploads, listing, verified downloads, restore and pruning.

A snapshot is a local folder of files the server prepared (a RocksDB checkpoint, a memory
checkpoint) plus a dict of metadata. Uploading it sends only the files whose content is not
already in the store, then writes its manifest; RocksDB's SST files never change, so each is
sent once however many snapshots hold it. Every call is synchronous: the server runs them in
a worker thread.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rlreplay.app.backup.download import download_snapshot
from rlreplay.app.backup.errors import SnapshotCorrupt, SnapshotNotFound
from rlreplay.app.backup.location import BackupLocation
from rlreplay.app.backup.manifest import Manifest, check_snapshot_id, new_snapshot_id
from rlreplay.app.backup.options import storage_options_from_env
from rlreplay.app.backup.progress import ProgressInfo
from rlreplay.app.backup.upload import UploadResult, scan_folder, send_missing

__all__ = ["LATEST", "BackupStore"]

logger = logging.getLogger("rlreplay.backup")

LATEST = "latest"
"""What :meth:`BackupStore.restore` takes for "the newest snapshot that verifies"."""

_MB = 1 << 20


class BackupStore:
    """Snapshots kept under one fsspec URL, sharing files by content.

    Uploads and prunes of one store object take turns (a lock), so a prune never deletes the
    files of an upload whose manifest is not written yet. Two processes pruning and
    uploading on the same URL at once are not supported.

    Args:
        url: Any fsspec URL: ``s3://bucket/prefix``, ``gs://...``, ``file:///srv/backups``.
        storage_options: Filesystem options (credentials, ``client_kwargs``); see
            :meth:`options_from_env`. S3 otherwise reads the usual ``AWS_*`` variables.
        part_size_mb: Size of a part of a multipart upload, and of a read while
            downloading; S3 refuses parts under 5 MiB.
        concurrency: Files transferred at once, and parts of one large file at once.
            Multipart buffers take about ``concurrency * part_size_mb`` MiB of memory.

    Raises:
        ValueError: A bad argument, named with its value.
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        part_size_mb: int = 64,
        concurrency: int = 8,
    ) -> None:
        if part_size_mb < 5:
            raise ValueError(f"part_size_mb ({part_size_mb}) must be >= 5, S3's smallest part")
        if concurrency < 1:
            raise ValueError(f"concurrency ({concurrency}) must be >= 1")
        self._location = BackupLocation(url, dict(storage_options or {}))
        self._part_bytes = part_size_mb * _MB
        self._concurrency = concurrency
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The store's URL, without a trailing slash."""
        return self._location.url

    @staticmethod
    def options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Storage options from ``RLREPLAY_BACKUP_STORAGE_OPTIONS`` (a JSON object); ``{}``
        when unset. ``ValueError`` naming the variable if it is not a JSON object."""
        return storage_options_from_env(environ)

    def new_id(self, now: float | None = None) -> str:
        """A fresh snapshot id that sorts by time, e.g. ``20261125T050102.123Z-3fa9c1``."""
        return new_snapshot_id(now)

    def manifest_url(self, snapshot_id: str) -> str:
        """The URL of a snapshot's manifest, for logs and operators."""
        return self._location.url_of(self._location.manifest_path(check_snapshot_id(snapshot_id)))

    def upload(
        self,
        local_dir: Path,
        meta: dict[str, Any],
        *,
        snapshot_id: str | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> UploadResult:
        """Upload the files under ``local_dir`` as one snapshot; the manifest goes last.

        Every file (recursively; empty folders are not kept) is checksummed in a stream;
        those whose content is not in the store yet are uploaded concurrently. A crash or an
        error before the manifest is written leaves no snapshot, only unreferenced files
        that the next upload reuses and :meth:`prune` deletes.

        Args:
            local_dir: The snapshot folder, not modified while the upload runs.
            meta: JSON-serializable metadata kept in the manifest.
            snapshot_id: The id to write; a fresh :meth:`new_id` if ``None``.
            progress: Called in the calling thread after each uploaded file with
                ``(bytes_uploaded, bytes_to_upload)``; an exception from it stops the upload.

        Raises:
            ValueError: ``local_dir`` is not a folder, ``meta`` is not JSON-serializable,
                or ``snapshot_id`` is not a valid id.
            SnapshotExists: A manifest with ``snapshot_id`` is already there.
            BackupUnavailable: The backend failed.
        """
        if not local_dir.is_dir():
            raise ValueError(f"local_dir {str(local_dir)!r} is not a folder")
        snapshot_id = self.new_id() if snapshot_id is None else check_snapshot_id(snapshot_id)
        try:
            json.dumps(meta, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"meta is not JSON-serializable: {exc}") from exc
        created_at = time.time()
        with self._lock:
            files = scan_folder(local_dir, workers=self._concurrency)
            sent = send_missing(
                self._location,
                local_dir,
                files,
                part_bytes=self._part_bytes,
                workers=self._concurrency,
                progress=progress,
            )
            manifest = Manifest(id=snapshot_id, created_at=created_at, files=files, meta=meta)
            self._location.create_manifest(snapshot_id, manifest.to_json())
        sent_objects = {t.object for t in sent}
        result = UploadResult(
            manifest=manifest,
            uploaded_bytes=sum(t.size for t in sent),
            uploaded_files=len(sent),
            reused_files=sum(1 for f in files if f.object not in sent_objects),
        )
        logger.info(
            "snapshot %s uploaded to %s: %d files (%d bytes) sent, %d files reused",
            snapshot_id,
            self.url,
            result.uploaded_files,
            result.uploaded_bytes,
            result.reused_files,
        )
        return result

    def list(self) -> list[Manifest]:
        """Every complete snapshot, newest first.

        A manifest that cannot be parsed is skipped with a warning: such a snapshot cannot
        be restored, and one bad manifest must not hide the others.

        Raises:
            BackupUnavailable: The backend failed.
        """
        return self._read_all()[0]

    def _read_all(self) -> tuple[builtins.list[Manifest], builtins.list[str]]:
        """The readable manifests, newest first, and the ids of those that are not."""
        manifests, unreadable = [], []
        ids = self._location.manifest_ids()
        for snapshot_id, data in self._location.read_manifests(ids).items():
            if isinstance(data, FileNotFoundError):
                continue  # pruned since it was listed
            try:
                manifests.append(self._parse(snapshot_id, data))
            except SnapshotCorrupt as exc:
                logger.warning("skipping snapshot %s: %s", snapshot_id, exc)
                unreadable.append(snapshot_id)
        manifests.sort(key=lambda m: (m.created_at, m.id), reverse=True)
        return manifests, unreadable

    def get(self, snapshot_id: str) -> Manifest:
        """The manifest of ``snapshot_id``.

        Raises:
            SnapshotNotFound: There is no such snapshot.
            SnapshotCorrupt: Its manifest cannot be parsed.
            BackupUnavailable: The backend failed.
        """
        check_snapshot_id(snapshot_id)
        try:
            data = self._location.read_manifest(snapshot_id)
        except FileNotFoundError as exc:
            raise SnapshotNotFound(f"no snapshot {snapshot_id!r} at {self.url}") from exc
        return self._parse(snapshot_id, data)

    def _parse(self, snapshot_id: str, data: bytes) -> Manifest:
        try:
            manifest = Manifest.from_json(data)
        except ValueError as exc:
            url = self.manifest_url(snapshot_id)
            raise SnapshotCorrupt(f"manifest {url} is unreadable: {exc}") from exc
        if manifest.id != snapshot_id:
            raise SnapshotCorrupt(f"manifest {snapshot_id!r} names snapshot {manifest.id!r}")
        return manifest

    def download(
        self,
        snapshot_id: str,
        dest_dir: Path,
        *,
        progress: Callable[[ProgressInfo], None] | None = None,
    ) -> Manifest:
        """Download and verify every file of a snapshot into ``dest_dir``.

        Files are downloaded concurrently into a hidden folder beside ``dest_dir``, each
        checked for size and xxh3_128 as it is written; only when all verify is the folder
        renamed to ``dest_dir``. On any failure ``dest_dir`` is left as it was.

        Args:
            snapshot_id: The snapshot.
            dest_dir: Must not exist or be empty.
            progress: Called in the calling thread after each verified file.

        Raises:
            FileExistsError: ``dest_dir`` exists and is not an empty folder.
            SnapshotNotFound: There is no such snapshot.
            SnapshotCorrupt: A file is missing or differs from the manifest; the message
                names the file and both checksums.
            BackupUnavailable: The backend failed.
        """
        manifest = self.get(snapshot_id)
        self._download(manifest, dest_dir, progress)
        return manifest

    def download_files(
        self,
        manifest: Manifest,
        paths: Iterable[str],
        dest_dir: Path,
        *,
        progress: Callable[[ProgressInfo], None] | None = None,
    ) -> None:
        """Download and verify only the files of ``manifest`` named in ``paths`` into
        ``dest_dir``, as :meth:`download` does for all (``rlreplay export`` reads one
        table's files).

        Raises:
            ValueError: ``paths`` names a file the snapshot does not have.
            FileExistsError, SnapshotCorrupt, BackupUnavailable: As :meth:`download`.
        """
        wanted = set(paths)
        files = tuple(f for f in manifest.files if f.path in wanted)
        unknown = wanted - {f.path for f in files}
        if unknown:
            raise ValueError(f"snapshot {manifest.id} has no file {sorted(unknown)[0]!r}")
        self._download(dataclasses.replace(manifest, files=files), dest_dir, progress)

    def restore(
        self,
        which: str,
        dest_dir: Path,
        *,
        progress: Callable[[ProgressInfo], None] | None = None,
        stop: threading.Event | None = None,
    ) -> Manifest:
        """Download ``which`` (an id, or ``"latest"``) into ``dest_dir``; its manifest.

        For ``"latest"``, a snapshot that fails verification is refused with a warning
        saying why, and the next older one is tried: an old whole snapshot is better than
        none. ``stop``, set from another thread, stops the download (see
        :func:`~rlreplay.app.backup.download.download_snapshot`).

        Raises:
            SnapshotNotFound: No such snapshot, or for ``"latest"`` none that verifies.
            SnapshotCorrupt: The snapshot named by id does not verify.
            FileExistsError: ``dest_dir`` exists and is not an empty folder.
            BackupUnavailable: The backend failed.
            TransferStopped: ``stop`` was set; nothing was left in ``dest_dir``'s folder.
        """
        if which != LATEST:
            manifest = self.get(which)
            self._download(manifest, dest_dir, progress, stop)
            return manifest
        refused = []
        for manifest in self.list():
            try:
                self._download(manifest, dest_dir, progress, stop)
            except SnapshotCorrupt as exc:
                logger.warning(
                    "refusing snapshot %s: %s; trying the next older one", manifest.id, exc
                )
                refused.append(manifest.id)
                continue
            return manifest
        why = f" ({len(refused)} refused as corrupt: {', '.join(refused)})" if refused else ""
        raise SnapshotNotFound(f"no usable snapshot at {self.url}{why}")

    def _download(
        self,
        manifest: Manifest,
        dest_dir: Path,
        progress: Callable[[ProgressInfo], None] | None,
        stop: threading.Event | None = None,
    ) -> None:
        download_snapshot(
            self._location,
            manifest,
            dest_dir,
            block_bytes=self._part_bytes,
            workers=self._concurrency,
            progress=progress,
            stop=stop,
        )

    def prune(self, keep: int) -> builtins.list[str]:
        """Delete all but the newest ``keep`` snapshots; the ids deleted, newest first.

        Manifests go first, so a snapshot is gone before any of its files; then every
        object under ``files/`` that no kept manifest names is deleted, which also collects
        the files of interrupted uploads. An object a kept manifest names is never deleted.
        While any manifest is unreadable (damaged, or of a newer format), no file is
        deleted: what it refers to is unknown.

        Raises:
            ValueError: ``keep`` is below 1.
            BackupUnavailable: The backend failed; a later prune finishes the work.
        """
        if keep < 1:
            raise ValueError(f"keep ({keep}) must be >= 1")
        with self._lock:
            manifests, unreadable = self._read_all()
            kept, dropped = manifests[:keep], manifests[keep:]
            self._location.delete_manifests([m.id for m in dropped])
            referenced = {f.object for m in kept for f in m.files}
            garbage = sorted(o for o in self._location.objects() if o not in referenced)
            if unreadable:
                logger.warning(
                    "prune keeps all files at %s: manifests %s cannot be read",
                    self.url,
                    ", ".join(unreadable),
                )
                garbage = []
            self._location.delete_objects(garbage)
        logger.info(
            "pruned %d snapshots and %d files from %s", len(dropped), len(garbage), self.url
        )
        return [m.id for m in dropped]
