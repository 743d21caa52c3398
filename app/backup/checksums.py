"""Streamed xxh3_128 checksums: the content address of every file in a snapshot.

xxh3_128 hashes at several GB/s, so checksumming a snapshot costs far less than uploading it,
and 128 bits make an accidental collision between two files of a backup negligible. Files are
read in chunks so a multi-GB SST file never has to fit in memory.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import IO

import xxhash

from rlreplay.app.backup.errors import TransferStopped

__all__ = ["CHUNK_BYTES", "checksum_bytes", "checksum_file", "copy_with_checksum"]

CHUNK_BYTES = 1 << 20
"""Bytes read at a time: large enough to amortise calls, small enough to stay in cache."""


def checksum_bytes(data: bytes) -> str:
    """The xxh3_128 hex digest of ``data``."""
    return xxhash.xxh3_128_hexdigest(data)


def checksum_file(path: Path) -> tuple[int, str]:
    """The size and xxh3_128 hex digest of the file at ``path``, read in chunks."""
    digest = xxhash.xxh3_128()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def copy_with_checksum(
    src: IO[bytes], dst: IO[bytes], *, stop: threading.Event | None = None
) -> tuple[int, str]:
    """Copy ``src`` to ``dst`` and return the size and xxh3_128 hex digest of what was copied.

    Hashing while copying verifies a download in the same pass that writes it.

    Raises:
        TransferStopped: ``stop`` was set (checked before each chunk).
    """
    digest = xxhash.xxh3_128()
    size = 0
    while chunk := src.read(CHUNK_BYTES):
        if stop is not None and stop.is_set():
            raise TransferStopped(f"stopped after {size} bytes")
        digest.update(chunk)
        dst.write(chunk)
        size += len(chunk)
    return size, digest.hexdigest()
