"""The write-ahead log's segment files: the folder's lock, opening, rotating, recycling
and retiring segments (blocking: each runs in an I/O thread).

Segments are recycled (as RocksDB's ``recycle_log_file_num`` and PostgreSQL's WAL files are):
a segment the checkpoint no longer needs is renamed ``*.spare`` and becomes the next new
segment, whose writes then overwrite blocks the file already has, so an fdatasync commits no
block allocation. A recycled segment holds the old records after the new ones: they have
LSNs below the segment's name, and replay stops at the first of them. A segment is cut to its
written length when it is closed, so only the segment being written at a crash can have them.

A segment is put in place whole: its header block is written and fsynced under a temporary
name (``*.new``), then it takes its own; and the log's manifest
(:mod:`rlreplay.app.log.manifest`) lists it before a record goes into it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from pathlib import Path

from rlreplay.app.log.framing import (
    BLOCK,
    O_DIRECT,
    SEGMENT_SUFFIX,
    SPARE_SUFFIX,
    segment_header,
    segment_name,
)
from rlreplay.app.log.manifest import LogManifest, ManifestFile
from rlreplay.app.storage.blocking import BlockingIO

log = logging.getLogger("rlreplay.app.log.wal")

SPARES = 1  # spare segments kept (each rotation takes one, each truncation gives one)
LOCK_WAIT_S = 30.0  # how long to wait for the folder's lock (a dying writer's last write)
NEW_SUFFIX = ".new"  # a segment being put in place, before its header is durable


class SegmentFiles:
    """The part of :class:`~rlreplay.app.log.wal.WriteAheadLog` that manages its files (a base
    class of it: the state below is the log's, set up by its constructor)."""

    _folder: Path
    _io: BlockingIO
    _lock_fd: int | None
    _fd: int | None
    _offset: int
    _failed: bool
    _direct: bool | None
    _mode_logged: bool
    _segment_token: object
    _segments: list[tuple[int, Path]]
    _segment_last_lsn: dict[Path, int]
    _spares: list[Path]
    _spares_lock: threading.Lock
    _next_lsn: int
    _durable_lsn: int
    _buffer_last_lsn: int
    _manifest: ManifestFile
    _manifest_lock: threading.Lock
    _checkpoint_lsn: int  # the position the last checkpoint covered, for the manifest

    def _lock(self) -> None:
        """Take the folder's lock (blocking), waiting up to LOCK_WAIT_S for another holder.

        The log writer process inherits the lock: if this process is killed, a new one waits
        here until that process has finished its last write and exited, so it never replays
        a segment that is still being written, nor reuses its name.
        """
        if self._lock_fd is not None:
            return
        self._folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._folder / "LOCK", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise RuntimeError(
                        f"the write-ahead log in {self._folder} is in use by another process"
                    ) from None
                time.sleep(0.05)
        self._lock_fd = fd

    def open(self, min_lsn: int) -> None:
        """Start a fresh segment for new records; LSNs continue above ``min_lsn`` (blocking)."""
        self._lock()
        for leftover in self._folder.glob(f"*{NEW_SUFFIX}"):  # a crash while one was put in place
            leftover.unlink(missing_ok=True)
        with self._spares_lock:
            self._spares = sorted(self._folder.glob(f"*{SPARE_SUFFIX}"), key=lambda p: int(p.stem))
        self._next_lsn = max(self._next_lsn, min_lsn + 1)
        self._durable_lsn = self._buffer_last_lsn = self._next_lsn - 1
        self._rotate_sync(self._next_lsn)

    def _rotate_sync(self, first_lsn: int) -> None:
        """Close the current segment and start one named ``first_lsn``: the LSN of the
        first record not written yet (records appended during this flush go there).

        A segment that already has that name holds no whole record (each would have an
        LSN at or above its name, none of which is written yet): if it is the current one,
        it is kept; if replay found it (a crash left it torn), it is replaced. Otherwise a
        spare segment becomes the new one, if there is one. The segment closed is cut to
        its written length (a recycled one had old records after it).
        """
        path = self._folder / segment_name(first_lsn)
        if self._fd is not None:
            if self._segments[-1][1] == path and not self._failed:
                return
            try:
                os.ftruncate(self._fd, self._offset)
                os.fsync(self._fd)
            except OSError:
                if not self._failed:  # after a failed flush, what it synced was synced then
                    raise
            os.close(self._fd)
            self._fd = None
        self._put_in_place(path, first_lsn)
        self._fd = self._open_segment(path)
        self._segment_token = object()
        self._offset = BLOCK
        self._failed = False
        if not self._segments or self._segments[-1][1] != path:
            self._segments.append((first_lsn, path))
        self._segment_last_lsn[path] = first_lsn - 1
        self._write_manifest()

    def _put_in_place(self, path: Path, first_lsn: int) -> None:
        """Make ``path`` a segment with its header block and no record: a spare (its old
        records stay after the header, with LSNs replay stops at) or a new file, whose
        header is durable before it takes the name."""
        new = path.with_suffix(NEW_SUFFIX)
        spare = None
        if not path.exists():
            with self._spares_lock:
                spare = self._spares.pop() if self._spares else None
        if spare is not None:
            os.rename(spare, new)
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (0 if spare is not None else os.O_TRUNC)
        fd = os.open(new, flags, 0o644)
        try:
            header = segment_header(first_lsn)
            if os.pwrite(fd, header, 0) != len(header):
                raise OSError(errno.EIO, f"a short write of {path.name}'s header")
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.rename(new, path)
        fd = os.open(self._folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_manifest(self) -> None:
        """List the segments and the checkpoint's position in the manifest (blocking). A
        failure is logged, not raised: a stale manifest only lists less than there is."""
        with self._manifest_lock:
            firsts = tuple(first for first, _ in self._segments)
            try:
                self._manifest.write(LogManifest(self._checkpoint_lsn, firsts))
            except OSError as exc:
                log.warning(
                    "write-ahead log in %s: the manifest's write failed: %s", self._folder, exc
                )

    def _open_segment(self, path: Path, extra_flags: int = 0) -> int:
        """Open ``path`` for writing: ``O_DIRECT`` unless the log has fallen back."""
        flags = os.O_WRONLY | os.O_CREAT | extra_flags
        if self._direct is not False:
            try:
                return os.open(path, flags | O_DIRECT, 0o644)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._fall_back(path, exc)
        fd = os.open(path, flags, 0o644)
        self._log_mode("buffered writes")
        return fd

    def _fall_back(self, path: Path, exc: OSError) -> None:
        self._direct = False
        self._log_mode(f"buffered writes ({path.name} refused O_DIRECT: {exc.strerror})")

    def _log_mode(self, mode: str) -> None:
        if not self._mode_logged:
            self._mode_logged = True
            log.info("write-ahead log in %s: %s", self._folder, mode)

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
        self._checkpoint_lsn = max(self._checkpoint_lsn, covered_lsn)
        await self._io.run(self._retire_sync, [p for _, p in doomed])

    def _retire_sync(self, paths: list[Path]) -> None:
        """Keep segments as spares (up to SPARES of them), delete the others (blocking),
        once the manifest no longer lists them. A crash before a rename leaves a segment
        whose records replay skips (all covered)."""
        self._write_manifest()
        for path in paths:
            with self._spares_lock:
                if path.suffix == SEGMENT_SUFFIX and len(self._spares) < SPARES:
                    spare = path.with_suffix(SPARE_SUFFIX)
                    try:
                        os.rename(path, spare)
                    except FileNotFoundError:
                        continue
                    self._spares.append(spare)
                    continue
            path.unlink(missing_ok=True)

    def disk_bytes(self) -> int:
        """Bytes of log on disk (approximate: sizes of the segment files, spares included)."""
        total = 0
        with self._spares_lock:
            spares = list(self._spares)
        for path in [*(p for _, p in self._segments), *spares]:
            try:
                total += path.stat().st_size
            except FileNotFoundError:
                pass
        return total
