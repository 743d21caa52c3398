"""The write-ahead log: accepted writes are appended here and fsynced before they are answered.

Records are framed ``<length:u32><crc32:u32><msgpack payload>``; the payload is a list
whose first element is the record's LSN. The log is a folder of segment files named by
the first LSN they may hold. A torn or corrupt tail (a crash in mid-write) ends replay at
the last whole record, so recovery never applies half a record.

Group commit: :meth:`WriteAheadLog.append` only buffers; :meth:`WriteAheadLog.commit`
makes the caller wait until its record is on disk. While one fsync runs, every record
appended meanwhile waits for the next one, so many concurrent pushes share one fsync.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack

from app.storage.blocking import BlockingIO

log = logging.getLogger(__name__)

FRAME = struct.Struct("<II")
_IOV_MAX = 1024  # buffers per writev call (Linux's IOV_MAX)
SEGMENT_SUFFIX = ".log"


def _segment_name(first_lsn: int) -> str:
    return f"{first_lsn:020d}{SEGMENT_SUFFIX}"


class WriteAheadLog:
    """Append-only, segment-rotated, fsync-on-commit log of engine records."""

    def __init__(self, folder: Path, *, io: BlockingIO, group_commit_s: float = 0.0) -> None:
        self._folder = folder
        self._io = io
        self._group_commit_s = group_commit_s
        self._buffer: list[bytes] = []  # payloads appended, not yet written (framed on write)
        self._buffer_last_lsn = 0
        self._durable_lsn = 0
        self._next_lsn = 1
        self._flushing: asyncio.Future[None] | None = None
        self._fd: int | None = None
        self._segments: list[tuple[int, Path]] = []  # (first lsn, path), oldest first
        self._segment_last_lsn: dict[Path, int] = {}
        self.bytes_since_checkpoint = 0

    # -- opening and replay -------------------------------------------------------------

    def replay(self, after_lsn: int) -> Iterator[list[Any]]:
        """Yield every whole record with LSN > ``after_lsn``, oldest first (blocking)."""
        self._folder.mkdir(parents=True, exist_ok=True)
        paths = sorted(self._folder.glob(f"*{SEGMENT_SUFFIX}"))
        last = after_lsn
        for path in paths:
            seg_last = 0
            for record, end in self._read_segment(path):
                seg_last = record[0]
                if record[0] > after_lsn:
                    last = max(last, record[0])
                    yield record
                del end
            self._segments.append((int(path.stem), path))
            self._segment_last_lsn[path] = seg_last
        self._next_lsn = last + 1
        self._durable_lsn = last

    @staticmethod
    def _read_segment(path: Path) -> Iterator[tuple[list[Any], int]]:
        data = path.read_bytes()
        pos = 0
        while pos + FRAME.size <= len(data):
            length, crc = FRAME.unpack_from(data, pos)
            start, end = pos + FRAME.size, pos + FRAME.size + length
            if end > len(data) or zlib.crc32(data[start:end]) != crc:
                log.warning("log %s: torn record at byte %d, replay stops there", path.name, pos)
                break
            yield msgpack.unpackb(data[start:end], raw=False, strict_map_key=False), end
            pos = end

    def open(self, min_lsn: int) -> None:
        """Start a fresh segment for new records; LSNs continue above ``min_lsn`` (blocking)."""
        self._next_lsn = max(self._next_lsn, min_lsn + 1)
        self._durable_lsn = self._next_lsn - 1
        self._rotate_sync()

    def _rotate_sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
        path = self._folder / _segment_name(self._next_lsn)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._segments.append((self._next_lsn, path))
        self._segment_last_lsn[path] = self._next_lsn - 1
        fd = os.open(self._folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- appending ----------------------------------------------------------------------

    @property
    def next_lsn(self) -> int:
        """The LSN the next record gets."""
        return self._next_lsn

    def append(self, body: list[Any]) -> int:
        """Buffer one record (``body`` without its LSN); returns the LSN given to it."""
        lsn = self._next_lsn
        self._next_lsn += 1
        payload = msgpack.packb([lsn, *body], use_bin_type=True)
        self._buffer.append(payload)
        self._buffer_last_lsn = lsn
        self.bytes_since_checkpoint += len(payload) + FRAME.size
        return lsn

    async def commit(self, lsn: int) -> None:
        """Return once the record ``lsn`` (and every one before it) is fsynced."""
        while self._durable_lsn < lsn:
            if self._flushing is not None:
                await asyncio.shield(self._flushing)
                continue
            if self._group_commit_s:
                await asyncio.sleep(self._group_commit_s)
                if self._flushing is not None or self._durable_lsn >= lsn:
                    continue
            await self._flush_once()

    async def _flush_once(self, *, rotate: bool = False) -> None:
        """Write and fsync the buffer (then rotate, if asked). One flush runs at a time:
        ``_flushing`` is set before the first await, so every file operation is ordered."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._flushing = fut
        data, upto = self._buffer, self._buffer_last_lsn
        self._buffer = []
        try:
            await self._io.run(self._write_sync, data, upto, rotate)
            self._durable_lsn = max(self._durable_lsn, upto)
            fut.set_result(None)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: waiters get it through shield
            raise
        finally:
            self._flushing = None

    def _write_sync(self, payloads: list[bytes], upto: int, rotate: bool = False) -> None:
        """Frame (length, CRC32: computed here, off the event loop), write, fdatasync."""
        if payloads:
            assert self._fd is not None
            parts: list[bytes] = []
            for payload in payloads:
                parts.append(FRAME.pack(len(payload), zlib.crc32(payload)))
                parts.append(payload)
            for first in range(0, len(parts), _IOV_MAX):
                _write_all(self._fd, parts[first : first + _IOV_MAX])
            os.fdatasync(self._fd)
            self._segment_last_lsn[self._segments[-1][1]] = upto
        if rotate:
            self._rotate_sync()

    async def sync(self) -> None:
        """Fsync everything appended so far."""
        await self.commit(self._next_lsn - 1)

    # -- checkpoints --------------------------------------------------------------------

    async def rotate(self) -> None:
        """Write and fsync what is buffered, close the segment and start a new one."""
        self.bytes_since_checkpoint = 0
        while self._flushing is not None:
            await asyncio.shield(self._flushing)
        await self._flush_once(rotate=True)

    async def truncate(self, covered_lsn: int) -> None:
        """Delete the segments whose every record has LSN ≤ ``covered_lsn``."""
        doomed = [
            (first, path)
            for first, path in self._segments[:-1]
            if self._segment_last_lsn.get(path, 0) <= covered_lsn
        ]
        for item in doomed:
            self._segments.remove(item)
            self._segment_last_lsn.pop(item[1], None)
        await self._io.run(self._unlink_sync, [p for _, p in doomed])

    @staticmethod
    def _unlink_sync(paths: list[Path]) -> None:
        for path in paths:
            path.unlink(missing_ok=True)

    def disk_bytes(self) -> int:
        """Bytes of log on disk (approximate: sizes of the segment files)."""
        total = 0
        for _, path in self._segments:
            try:
                total += path.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def close(self) -> None:
        """Flush the buffer, fsync and close (blocking); idempotent."""
        if self._fd is not None:
            if self._buffer:
                self._write_sync(self._buffer, self._buffer_last_lsn)
                self._buffer = []
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None


def _write_all(fd: int, parts: list[bytes]) -> None:
    """``writev`` all of ``parts``, going on after a short write."""
    remaining = sum(len(p) for p in parts)
    written = os.writev(fd, parts)
    while written < remaining:
        remaining -= written
        parts = [b"".join(parts)[-remaining:]]
        written = os.writev(fd, parts)
