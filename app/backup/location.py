"""Where backups live: an fsspec filesystem, a root under it, and the layout of that root.

The layout under the root::

    files/<xxh3_128 hex>/<basename>   content-addressed file, shared by every snapshot with it
    manifests/<snapshot id>.json      one per complete snapshot, written last, create-only

This module is the only one that calls the filesystem. It knows which backends can rename
cheaply (the local one: uploads go to a temporary name and are renamed into place) and which
cannot (object stores: a PUT is atomic, so objects are written under their final name) and
which split large files into parts, and it turns backend failures into
:class:`~rlreplay.app.backup.errors.BackupUnavailable`.
"""

from __future__ import annotations

import contextlib
import posixpath
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from rlreplay.app.backup.errors import BACKEND_ERRORS, BackupUnavailable, SnapshotExists

__all__ = ["BackupLocation"]

FILES = "files"
MANIFESTS = "manifests"
MANIFEST_SUFFIX = ".json"

# Backends whose put_file uploads a large file in parts, and the keywords that size them.
_MULTIPART: dict[str, tuple[str, ...]] = {
    "s3": ("chunksize", "max_concurrency"),
    "s3a": ("chunksize", "max_concurrency"),
    "gs": ("chunksize",),
    "gcs": ("chunksize",),
}


class BackupLocation:
    """A backup URL opened through fsspec, with the store's layout under it.

    Args:
        url: Any fsspec URL: ``s3://bucket/prefix``, ``file:///srv/backups``, ``memory://x``.
        storage_options: Keyword arguments for the filesystem (credentials, endpoint).

    Raises:
        ValueError: The URL is empty, its protocol is unknown, or the package that serves
            it (s3fs, gcsfs) is not installed; the message names the URL.
    """

    def __init__(self, url: str, storage_options: dict[str, Any]) -> None:
        if not url.strip():
            raise ValueError("backup url ('') must not be empty")
        try:
            fs, root = fsspec.core.url_to_fs(url, **storage_options)
        except (ValueError, ImportError) as exc:
            raise ValueError(f"backup url {url!r} cannot be opened: {exc}") from exc
        self.url = url.rstrip("/")
        self.fs: fsspec.AbstractFileSystem = fs
        self.root: str = root.rstrip("/")
        self._local = isinstance(fs, LocalFileSystem)
        protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
        self._part_keywords = next((_MULTIPART[p] for p in protocols if p in _MULTIPART), ())

    @property
    def multipart(self) -> bool:
        """Whether the backend uploads a large file in parts (object stores)."""
        return bool(self._part_keywords)

    def url_of(self, relative: str) -> str:
        """The URL of ``relative`` (a path under the root), for messages and callers."""
        return f"{self.url}/{relative}"

    def _path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    @contextlib.contextmanager
    def failing(self, what: str) -> Iterator[None]:
        """Turn a backend failure in the block into ``BackupUnavailable`` naming ``what``.

        ``FileNotFoundError`` passes through as it is: callers give it a meaning (no such
        snapshot, a missing object).
        """
        try:
            yield
        except FileNotFoundError:
            raise
        except BACKEND_ERRORS as exc:
            raise BackupUnavailable(f"{what} at {self.url}: {exc}") from exc

    def objects(self) -> dict[str, int]:
        """Every object under ``files/``, as path relative to the root -> size in bytes."""
        base = self._path(FILES)
        with self.failing("listing files"):
            self.fs.invalidate_cache(base)
            found: dict[str, dict[str, Any]] = self.fs.find(base, detail=True)
        prefix = f"{self.root}/"
        return {
            name.removeprefix(prefix): int(info["size"])
            for name, info in found.items()
            if info.get("type", "file") == "file"
        }

    def put_object(self, local: Path, relative: str, *, part_bytes: int, parts: int) -> None:
        """Upload ``local`` to ``relative``; whole or not at all where the backend allows.

        Object stores make a PUT (and a completed multipart upload) visible at once, so the
        object is written under its final name. The local backend copies byte by byte, so
        the copy goes to a hidden temporary name and is renamed into place.
        """
        target = self._path(relative)
        with self.failing(f"uploading {relative}"):
            if self._local:
                parent = posixpath.dirname(target)
                temporary = f"{parent}/.{Path(relative).name}.{secrets.token_hex(4)}.part"
                self.fs.makedirs(parent, exist_ok=True)
                self.fs.put_file(str(local), temporary)
                self.fs.mv(temporary, target)
                return
            sizing = {"chunksize": part_bytes, "max_concurrency": parts}
            self.fs.put_file(str(local), target, **{k: sizing[k] for k in self._part_keywords})

    def open_object(self, relative: str, *, block_bytes: int) -> IO[bytes]:
        """``relative`` opened for a sequential read."""
        stream: IO[bytes] = self.fs.open(self._path(relative), "rb", block_size=block_bytes)
        return stream

    def delete_objects(self, relatives: list[str]) -> None:
        """Delete objects (in batches where the backend has a bulk delete)."""
        if not relatives:
            return
        paths = [self._path(r) for r in relatives]
        with self.failing("deleting files"):
            self.fs.rm(paths)
            if self._local:
                # Only the local backend keeps a directory once its last file is gone.
                for parent in sorted({posixpath.dirname(p) for p in paths}):
                    if not self.fs.ls(parent):
                        self.fs.rmdir(parent)

    def manifest_path(self, snapshot_id: str) -> str:
        """The manifest's path relative to the root."""
        return f"{MANIFESTS}/{snapshot_id}{MANIFEST_SUFFIX}"

    def manifest_ids(self) -> list[str]:
        """Ids of every manifest present, complete or not yet readable."""
        base = self._path(MANIFESTS)
        try:
            with self.failing("listing manifests"):
                self.fs.invalidate_cache(base)
                names: list[str] = self.fs.find(base, maxdepth=1)
        except FileNotFoundError:  # nothing written there yet (a local folder not made)
            return []
        ids = []
        for name in names:
            base_name = name.rsplit("/", 1)[-1]
            if base_name.endswith(MANIFEST_SUFFIX) and not base_name.startswith("."):
                ids.append(base_name.removesuffix(MANIFEST_SUFFIX))
        return ids

    def read_manifests(self, snapshot_ids: list[str]) -> dict[str, bytes | FileNotFoundError]:
        """The bytes of each manifest, read concurrently where the backend can.

        A manifest deleted since it was listed comes back as its ``FileNotFoundError``.
        """
        if not snapshot_ids:
            return {}  # fsspec's cat of no paths raises
        paths = {self._path(self.manifest_path(i)): i for i in snapshot_ids}
        with self.failing("reading manifests"):
            got: dict[str, bytes | Exception] = self.fs.cat(list(paths), on_error="return")
        out: dict[str, bytes | FileNotFoundError] = {}
        for path, value in got.items():
            if isinstance(value, FileNotFoundError | bytes):
                out[paths[path]] = value
                continue
            raise BackupUnavailable(f"reading manifest {paths[path]} at {self.url}: {value}") from (
                value
            )
        return out

    def read_manifest(self, snapshot_id: str) -> bytes:
        """The bytes of one manifest; ``FileNotFoundError`` if there is none."""
        with self.failing(f"reading manifest {snapshot_id}"):
            data: bytes = self.fs.cat_file(self._path(self.manifest_path(snapshot_id)))
        return data

    def create_manifest(self, snapshot_id: str, data: bytes) -> None:
        """Write a manifest, only if none of that id exists; ``SnapshotExists`` otherwise.

        S3 makes the check atomic (``If-None-Match: *``); other backends check first; the
        local backend checks, writes a temporary file and renames it, so a reader never sees
        half a manifest. Ids carry a random suffix, so two writers of one id do not happen.
        """
        target = self._path(self.manifest_path(snapshot_id))
        taken = SnapshotExists(f"snapshot {snapshot_id!r} already exists at {self.url}")
        with self.failing(f"writing manifest {snapshot_id}"):
            if not self._local:
                try:
                    self.fs.pipe_file(target, data, mode="create")
                except FileExistsError as exc:
                    raise taken from exc
                return
            if self.fs.exists(target):
                raise taken
            parent = posixpath.dirname(target)
            temporary = f"{parent}/.{snapshot_id}{MANIFEST_SUFFIX}.{secrets.token_hex(4)}.part"
            self.fs.makedirs(parent, exist_ok=True)
            self.fs.pipe_file(temporary, data)
            self.fs.mv(temporary, target)

    def delete_manifests(self, snapshot_ids: list[str]) -> None:
        """Delete manifests: those snapshots stop existing at once."""
        if snapshot_ids:
            with self.failing("deleting manifests"):
                self.fs.rm([self._path(self.manifest_path(i)) for i in snapshot_ids])
