"""Uploading a snapshot's files: checksum them all, send those the store lacks.

Files are addressed by content, so a file already in the store (an SST file an earlier
snapshot sent, a partial upload's leftover of the right size) is not sent again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlreplay.app.backup.checksums import checksum_file
from rlreplay.app.backup.location import BackupLocation
from rlreplay.app.backup.manifest import Manifest, SnapshotFile
from rlreplay.workers.transfer_pool import completed

__all__ = ["Transfer", "UploadResult", "scan_folder", "send_missing"]


def scan_folder(local_dir: Path, *, workers: int) -> tuple[SnapshotFile, ...]:
    """Every file under ``local_dir`` (recursively), checksummed in ``workers`` threads.

    Empty folders are not recorded: a snapshot is its files.
    """
    paths = sorted(p for p in local_dir.rglob("*") if p.is_file())
    sums = dict(completed(checksum_file, paths, workers=workers))
    files = []
    for p in paths:
        relative = p.relative_to(local_dir).as_posix()
        size, checksum = sums[p]
        object_ = SnapshotFile.object_for(checksum, relative)
        files.append(SnapshotFile(path=relative, size=size, checksum=checksum, object=object_))
    return tuple(files)


@dataclass
class UploadResult:
    """What an upload did.

    Attributes:
        manifest: The snapshot's manifest, as written.
        uploaded_bytes: Bytes actually sent.
        uploaded_files: Objects sent (files with the same content and name are sent once).
        reused_files: Files of the snapshot whose content was already in the store.
    """

    manifest: Manifest
    uploaded_bytes: int
    uploaded_files: int
    reused_files: int


@dataclass(frozen=True)
class Transfer:
    """One object to upload: the local file that holds its content, and its size."""

    object: str
    local: Path
    size: int


def send_missing(
    location: BackupLocation,
    local_dir: Path,
    files: tuple[SnapshotFile, ...],
    *,
    part_bytes: int,
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> list[Transfer]:
    """Upload the objects of ``files`` the store lacks (or holds at another size); those sent.

    On backends that upload in parts, a file big enough to be split goes alone with
    ``workers`` parts at once, so part buffers stay near ``workers * part_bytes``; smaller
    files go ``workers`` at a time.

    Args:
        location: The store.
        local_dir: The snapshot folder ``files`` are relative to.
        files: The snapshot's files.
        part_bytes: Size of one part of a multipart upload.
        workers: Files, or parts of one large file, sent at once.
        progress: Called in the calling thread after each file with
            ``(bytes_sent, bytes_to_send)``; an exception from it stops the upload.
    """
    present = location.objects()
    missing: dict[str, Transfer] = {}
    for f in files:
        if present.get(f.object) != f.size and f.object not in missing:
            missing[f.object] = Transfer(f.object, local_dir / f.path, f.size)
    total = sum(t.size for t in missing.values())
    done = 0

    def put(transfer: Transfer, parts: int = 1) -> None:
        location.put_object(transfer.local, transfer.object, part_bytes=part_bytes, parts=parts)

    split = 2 * part_bytes if location.multipart else None
    large = [t for t in missing.values() if split is not None and t.size >= split]
    small = [t for t in missing.values() if split is None or t.size < split]
    for transfer in large:
        put(transfer, parts=workers)
        done += transfer.size
        if progress is not None:
            progress(done, total)
    for transfer, _ in completed(put, small, workers=workers):
        done += transfer.size
        if progress is not None:
            progress(done, total)
    return list(missing.values())
