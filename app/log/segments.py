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

A segment's size is settled before records go into it: a new one is extended (sparse) to
SEGMENT_BYTES, a recycled one keeps its old size if larger, and one whose next region would
pass its size is extended first, by its size so far (at least SEGMENT_BYTES); the manifest
records each size once it is durable. A segment being closed has its written length
recorded before it is cut to it. So no segment is ever shorter than the manifest says,
unless it was cut after its records were answered (a torn tail keeps the file's size).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import threading
import time
from pathlib import Path

from rlreplay.app.log.framing import (
    BLOCK,
    O_DIRECT,
    SEGMENT_SUFFIX,
    SPARE_SUFFIX,
    ZEROS,
    region_size,
    segment_header,
    segment_name,
)
from rlreplay.app.log.manifest import LogManifest, ManifestFile
from rlreplay.workers.blocking import BlockingIO

log = logging.getLogger("rlreplay.app.log.wal")

SPARES = 1  # spare segments kept (each rotation takes one, each truncation gives one)
LOCK_WAIT_S = 30.0  # how long to wait for the folder's lock (a dying writer's last write)
NEW_SUFFIX = ".new"  # a segment being put in place, before its header is durable
SEGMENT_BYTES = 16 << 20  # a new segment's size, and an extension's least (sparse: no block)
_MAX_EXTENSION = 256 << 20  # an extension's most


class SegmentFiles:
    """The log's segment files, which :class:`~rlreplay.app.log.wal.WriteAheadLog` holds:
    the folder's lock, the segment being written (its descriptor and the offset of the next
    region), the segments on disk, the spares, and the manifest listing them.

    Every method but :meth:`truncate` blocks (call it in an I/O thread). The flushers write
    regions at :attr:`offset` of :attr:`fd`; one writes at a time.

    Args:
        folder: Where the segment files live.
        io: The thread pool :meth:`truncate` retires segments in.
        direct: Open segments with ``O_DIRECT`` where the filesystem supports it.
    """

    def __init__(self, folder: Path, io: BlockingIO, *, direct: bool) -> None:
        self.folder = folder
        self._io = io
        self.lock_fd: int | None = None  # flock on LOCK: held by us and by our process
        self.fd: int | None = None  # the segment being written
        self.segment_token = object()  # replaced whenever fd changes
        self.offset = 0  # where the next region goes in the segment (a block boundary)
        self.failed = False  # a flush failed: the next one starts a new segment
        # None: O_DIRECT opened but no write yet proved it works; True / False: settled
        self.direct: bool | None = None if direct and O_DIRECT else False
        self._mode_logged = False
        self._segments: list[tuple[int, Path]] = []  # (first lsn, path), oldest first
        self._segment_last_lsn: dict[Path, int] = {}
        # spare segments (at most SPARES): truncate adds them, rotations take them, in I/O threads
        self._spares: list[Path] = []
        self._spares_lock = threading.Lock()
        self._manifest = ManifestFile(folder)
        self._manifest_lock = threading.Lock()
        self.checkpoint_lsn = 0  # the position the last checkpoint covered, for the manifest
        self._size = 0  # the size of the segment being written, as the manifest records it

    def lock(self) -> None:
        """Take the folder's lock (blocking), waiting up to LOCK_WAIT_S for another holder.

        The log writer process inherits the lock: if this process is killed, a new one waits
        here until that process has finished its last write and exited, so it never replays
        a segment that is still being written, nor reuses its name.
        """
        if self.lock_fd is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / "LOCK", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise RuntimeError(
                        f"the write-ahead log in {self.folder} is in use by another process"
                    ) from None
                time.sleep(0.05)
        self.lock_fd = fd

    def open(self, first_lsn: int) -> None:
        """Start a fresh segment named ``first_lsn``, for new records."""
        self.lock()
        for leftover in self.folder.glob(f"*{NEW_SUFFIX}"):  # a crash while one was put in place
            leftover.unlink(missing_ok=True)
        with self._spares_lock:
            self._spares = sorted(self.folder.glob(f"*{SPARE_SUFFIX}"), key=lambda p: int(p.stem))
        self.rotate(first_lsn)

    def found(self, first_lsn: int, path: Path, last_lsn: int) -> None:
        """Replay found the segment ``path``, holding ``first_lsn``..``last_lsn``."""
        self._segments.append((first_lsn, path))
        self._segment_last_lsn[path] = last_lsn

    def rotate(self, first_lsn: int) -> None:
        """Close the current segment and start one named ``first_lsn``: the LSN of the
        first record not written yet (records appended during this flush go there).

        A segment that already has that name holds no whole record (each would have an
        LSN at or above its name, none of which is written yet): if it is the current one,
        it is kept; if replay found it (a crash left it torn), it is replaced. Otherwise a
        spare segment becomes the new one, if there is one. The segment closed is cut to
        its written length (a recycled one had old records after it).
        """
        path = self.folder / segment_name(first_lsn)
        if self.fd is not None:
            if self._segments[-1][1] == path and not self.failed:
                return
            try:
                self._cut()
                os.fsync(self.fd)
            except OSError:
                if not self.failed:  # after a failed flush, what it synced was synced then
                    raise
            os.close(self.fd)
            self.fd = None
        self._size = self._put_in_place(path, first_lsn)
        self.fd = self._open_segment(path)
        self.segment_token = object()
        self.offset = BLOCK
        self.failed = False
        if not self._segments or self._segments[-1][1] != path:
            self._segments.append((first_lsn, path))
        self._segment_last_lsn[path] = first_lsn - 1
        self._write_manifest()

    def _put_in_place(self, path: Path, first_lsn: int) -> int:
        """Make ``path`` a segment with its header block and no record: a spare (its old
        records stay after the header, with LSNs replay stops at) or a new file, whose
        header and size are durable before it takes the name. Returns its size: at least
        SEGMENT_BYTES, and at least that of a file it replaces (the manifest may list
        that one's)."""
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
            size = max(os.fstat(fd).st_size, SEGMENT_BYTES, _size(path))
            os.ftruncate(fd, size)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.rename(new, path)
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return size

    def fits(self, size: int) -> bool:
        """Whether a region of ``size`` bytes at the offset stays within the segment's size
        (one that does not is written by :meth:`write_records`, which extends it first)."""
        return self.offset + size <= self._size

    def _extend(self, end: int) -> None:
        """Make the segment being written at least ``end`` bytes long, durably, and record
        its new size in the manifest (blocking)."""
        assert self.fd is not None
        # by its size so far (up to _MAX_EXTENSION): a log busy with long pushes extends
        # (a metadata fsync, and no flush ahead of a commit meanwhile) a few times, not at each
        size = max(self._size + min(max(SEGMENT_BYTES, self._size), _MAX_EXTENSION), end)
        os.ftruncate(self.fd, size)
        os.fsync(self.fd)
        self._size = size
        self._write_manifest()

    def _cut(self) -> None:
        """Cut the segment being written to its written length, once the manifest records
        that length (a crash in between leaves it longer than recorded, never shorter).
        If the manifest cannot be written, the segment keeps its size."""
        assert self.fd is not None
        self._size = self.offset
        if self._write_manifest():
            os.ftruncate(self.fd, self.offset)

    def _write_manifest(self) -> bool:
        """List the segments, their sizes and the checkpoint's position in the manifest
        (blocking); returns whether it was written. A failure is logged, not raised: a
        stale manifest only lists less than there is, and records sizes no larger."""
        with self._manifest_lock:
            firsts = tuple(first for first, _ in self._segments)
            last = len(self._segments) - 1
            sizes = tuple(
                self._size if i == last and self.fd is not None else _size(path)
                for i, (_, path) in enumerate(self._segments)
            )
            try:
                self._manifest.write(LogManifest(self.checkpoint_lsn, firsts, sizes))
            except OSError as exc:
                log.warning(
                    "write-ahead log in %s: the manifest's write failed: %s", self.folder, exc
                )
                return False
            return True

    def _open_segment(self, path: Path, extra_flags: int = 0) -> int:
        """Open ``path`` for writing: ``O_DIRECT`` unless the log has fallen back."""
        flags = os.O_WRONLY | os.O_CREAT | extra_flags
        if self.direct is not False:
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
        self.direct = False
        self._log_mode(f"buffered writes ({path.name} refused O_DIRECT: {exc.strerror})")

    def _log_mode(self, mode: str) -> None:
        if not self._mode_logged:
            self._mode_logged = True
            log.info("write-ahead log in %s: %s", self.folder, mode)

    def reserve(self, size: int) -> int:
        """The offset of a region of ``size`` bytes handed to the log writer process (the
        next region goes after it)."""
        offset = self.offset
        self.offset += size
        return offset

    def wrote(self, upto: int) -> None:
        """The segment being written holds the records up to LSN ``upto``, durable."""
        self._segment_last_lsn[self._segments[-1][1]] = upto

    def write_records(self, buf: mmap.mmap, used: int, upto: int) -> int:
        """Pad ``buf[:used]`` to a block boundary, write it at the segment's offset and
        fdatasync; returns the padding."""
        assert self.fd is not None
        size = region_size(used)
        if not self.fits(size):
            self._extend(self.offset + size)
        buf[used:size] = ZEROS[: size - used]
        with memoryview(buf) as view:
            self._write_region(view[:size])
        os.fdatasync(self.fd)
        self.offset += size
        self.wrote(upto)
        return size - used

    def _write_region(self, view: memoryview) -> None:
        """Write ``view`` at the segment's offset; fall back to buffered writes if the
        first ``O_DIRECT`` write is refused."""
        assert self.fd is not None
        try:
            _pwrite_all(self.fd, view, self.offset)
        except OSError as exc:
            if exc.errno != errno.EINVAL or self.direct is not None:
                raise
            path = self._segments[-1][1]
            os.close(self.fd)
            self.fd = None
            self._fall_back(path, exc)
            self.fd = self._open_segment(path)
            self.segment_token = object()
            _pwrite_all(self.fd, view, self.offset)
        if self.direct is None:
            self.direct = True
            self._log_mode("O_DIRECT writes")

    def seal(self) -> None:
        """Cut the segment being written to its written length (unless a flush failed:
        replay then stops at its torn region) and fsync it."""
        assert self.fd is not None
        if not self.failed:
            self._cut()
        os.fsync(self.fd)

    def close(self) -> None:
        """Close the segment being written, the manifest and the lock; idempotent."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self._manifest.close()
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

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
        self.checkpoint_lsn = max(self.checkpoint_lsn, covered_lsn)
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
        """Bytes of log on disk (approximate: sizes of the segment files, spares included;
        the segment being written counts up to its offset, not its size)."""
        total = 0
        with self._spares_lock:
            spares = list(self._spares)
        paths = [p for _, p in self._segments]
        if self.fd is not None and paths:
            total, paths = self.offset, paths[:-1]
        for path in [*paths, *spares]:
            try:
                total += path.stat().st_size
            except FileNotFoundError:
                pass
        return total


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    """``pwrite`` all of ``view`` at ``offset``, going on after a short write."""
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(errno.EIO, "pwrite wrote nothing")
        view, offset = view[written:], offset + written


def _size(path: Path) -> int:
    """The size of the file at ``path`` (0: there is none)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
