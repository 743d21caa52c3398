"""A snapshot's manifest: the list of its files and the server's metadata, written last.

The manifest is what makes a snapshot exist. Files are content-addressed and shared between
snapshots; a snapshot is listed only once its manifest is written, so a crash mid-upload
leaves unreferenced files (which ``prune`` collects) but never a half snapshot.

Every file is listed with its size and xxh3_128 checksum, and the manifest carries a
checksum of its own (``"checksum"``: xxh3_128 of the rest of the manifest, its keys sorted
and without spaces), so a damaged byte in it (the log position it covers, a file's
recorded checksum) is refused by name rather than trusted. Manifests written before it
had one are read without that check.
"""

from __future__ import annotations

import builtins
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, TypeVar

from rlreplay.app.backup.checksums import checksum_bytes

__all__ = ["FORMAT", "Manifest", "SnapshotFile", "check_snapshot_id", "new_snapshot_id"]

FORMAT = 1
"""The manifest format this code writes and reads; a newer one is refused by number."""

_T = TypeVar("_T")

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_CHECKSUM = re.compile(r"[0-9a-f]{32}")
_FIELDS = frozenset({"format", "id", "created_at", "files", "meta", "checksum"})


def new_snapshot_id(now: float | None = None) -> str:
    """A snapshot id that sorts by creation time, e.g. ``20261125T050102.123Z-3fa9c1``.

    The random suffix keeps two snapshots taken in the same millisecond apart.
    """
    now = time.time() if now is None else now
    millis = round(now * 1000)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(millis // 1000))
    return f"{stamp}.{millis % 1000:03d}Z-{secrets.token_hex(3)}"


def check_snapshot_id(snapshot_id: str) -> str:
    """``snapshot_id`` if it is safe as a file name, else ``ValueError`` naming it."""
    if not _ID.fullmatch(snapshot_id):
        raise ValueError(
            f"snapshot id {snapshot_id!r} must be 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return snapshot_id


def _check_relative(path: str) -> str:
    """``path`` if it is a relative posix path that stays inside the snapshot folder.

    A manifest is read from a remote store; a path like ``../x`` must not let it write
    outside the folder a download targets.
    """
    parts = PurePosixPath(path).parts
    if not parts or path.startswith("/") or "\\" in path or any(p in ("..", ".") for p in parts):
        raise ValueError(f"file path {path!r} must be relative and stay inside the snapshot")
    return path


@dataclass(frozen=True)
class SnapshotFile:
    """One file of a snapshot and where its bytes live in the store.

    Attributes:
        path: Relative posix path inside the snapshot folder, e.g. ``rocksdb/000012.sst``.
        size: Size in bytes.
        checksum: xxh3_128 hex digest of the content.
        object: Where the content lives, relative to the store's URL:
            ``files/<checksum>/<basename>``; snapshots with the same file share it.
    """

    path: str
    size: int
    checksum: str
    object: str

    def __post_init__(self) -> None:
        _check_relative(self.path)
        _check_relative(self.object)
        if self.size < 0:
            raise ValueError(f"file {self.path!r}: size ({self.size}) must be >= 0")
        if not _CHECKSUM.fullmatch(self.checksum):
            raise ValueError(f"file {self.path!r}: checksum {self.checksum!r} is not xxh3_128")

    @staticmethod
    def object_for(checksum: str, path: str) -> str:
        """The object a file of this content and path is stored under."""
        return f"files/{checksum}/{PurePosixPath(path).name}"


@dataclass(frozen=True)
class Manifest:
    """A complete snapshot: its id, when it was taken, its files and the server's metadata.

    Attributes:
        id: The snapshot id; also the manifest's file name, ``manifests/<id>.json``.
        created_at: Unix time (seconds) at which the upload started.
        files: Every file of the snapshot.
        meta: Free-form JSON object from the server (mode, lsn, tables, items, bytes...).
        format: The manifest format, :data:`FORMAT`.
    """

    id: str
    created_at: float
    files: tuple[SnapshotFile, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    format: int = FORMAT

    def __post_init__(self) -> None:
        check_snapshot_id(self.id)

    @property
    def bytes(self) -> int:
        """Total size of the snapshot's files."""
        return sum(f.size for f in self.files)

    def to_json(self) -> builtins.bytes:
        """The manifest as UTF-8 JSON; ``TypeError`` if ``meta`` is not JSON-serializable."""
        body = {
            "format": self.format,
            "id": self.id,
            "created_at": self.created_at,
            "files": [
                {"path": f.path, "size": f.size, "checksum": f.checksum, "object": f.object}
                for f in self.files
            ],
            "meta": self.meta,
        }
        body["checksum"] = _checksum_of(body)
        return json.dumps(body, indent=1, allow_nan=False).encode()

    @classmethod
    def from_json(cls, data: builtins.bytes | str) -> Manifest:
        """Read a manifest written by :meth:`to_json`.

        Raises:
            ValueError: The text is not a manifest of format :data:`FORMAT` (garbled,
                truncated, missing fields, or written by a newer version).
        """
        try:
            body = json.loads(data)
            if not isinstance(body, dict):
                raise ValueError(f"a manifest is a JSON object, got {type(body).__name__}")
            if body.get("format") != FORMAT:
                raise ValueError(f"manifest format {body.get('format')!r}, expected {FORMAT}")
            unknown = sorted(set(body) - _FIELDS)
            if unknown:  # a damaged name would otherwise pass unchecked
                raise ValueError(f"unknown field {unknown[0]!r}")
            recorded = body.pop("checksum", None)
            if recorded is not None and recorded != _checksum_of(body):
                raise ValueError(
                    f"its checksum {recorded!r} does not match its content "
                    f"({_checksum_of(body)}): the manifest is damaged"
                )
            files = tuple(
                SnapshotFile(
                    path=_typed(f["path"], str),
                    size=_typed(f["size"], int),
                    checksum=_typed(f["checksum"], str),
                    object=_typed(f["object"], str),
                )
                for f in body["files"]
            )
            meta = body.get("meta", {})
            if not isinstance(meta, dict):
                raise ValueError("manifest meta must be a JSON object")
            return cls(
                id=_typed(body["id"], str),
                created_at=float(_typed(body["created_at"], (int, float))),
                files=files,
                meta=meta,
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a manifest: {exc!r}") from exc


def _checksum_of(body: dict[str, Any]) -> str:
    """The checksum of a manifest's body (every field but ``checksum``)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return checksum_bytes(canonical.encode())


def _typed(value: object, kind: type[_T] | tuple[type[_T], ...]) -> _T:
    """``value`` if it is of ``kind`` (``bool`` is not an ``int`` here), else ``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{value!r} is not {kind}")
    return value
