"""The write-ahead log: accepted writes are appended here and fsynced before they are answered.

Group commit: :meth:`WriteAheadLog.append` only buffers; :meth:`WriteAheadLog.commit`
makes the caller wait until its record is on disk. While one fsync runs, every record
appended meanwhile waits for the next one, so many concurrent pushes share one fsync.

``append`` frames each record on the event loop, straight into a page-aligned shared buffer;
a flush only pads, writes and fdatasyncs that buffer while the next one fills, in the log
writer process (:mod:`rlreplay.app.log.flushes`) or in the flush thread. The on-disk format is
in :mod:`rlreplay.app.log.framing`, replay in :mod:`rlreplay.app.log.replay`, and what a failed
flush lost in :mod:`rlreplay.app.log.refusals`.
Segment files (the lock, rotation, recycling) are managed in :mod:`rlreplay.app.log.segments`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgpack
from xxhash import xxh3_64, xxh3_64_intdigest

from rlreplay.app.log.data_loss import DataLoss
from rlreplay.app.log.flushes import MAX_IN_FLIGHT, ProcessFlusher
from rlreplay.app.log.framing import (
    BIN32,
    FRAME,
    O_DIRECT,
    SEGMENT_SUFFIX,
    SPARE_SUFFIX,
    LogRecoveryError,
    region_size,
)
from rlreplay.app.log.in_use import mark_in_use, mark_not_needed
from rlreplay.app.log.refusals import Refusal, Refusals
from rlreplay.app.log.replay import ReplayPlan, ReplayResult, drop_spares, plan_replay
from rlreplay.app.log.segments import SegmentFiles
from rlreplay.workers.blocking import BlockingIO
from rlreplay.workers.log_writer_process import SUPPORTED, SharedBuffer

__all__ = [
    "FRAME",
    "MAX_IN_FLIGHT",
    "O_DIRECT",
    "SEGMENT_SUFFIX",
    "SPARE_SUFFIX",
    "LogRecoveryError",
    "Refusal",
    "WriteAheadLog",
]

log = logging.getLogger(__name__)

_BUFFER_BYTES = 4 << 20  # a write buffer's smallest size
#: A blob this long is copied into the buffer and hashed a step at a time, each step hashed
#: while it is still in the CPU's cache (read once from memory, not twice: the append of a
#: push of 16 MiB costs about a fifth less). The checksum is the same (xxh3 streamed).
HASH_WHILE_COPYING_BYTES = 2 << 20
_COPY_STEP = 2 << 20


class WriteAheadLog:
    """Append-only, segment-rotated, fsync-on-commit log of engine records.

    It holds its parts: the segment files (:class:`~rlreplay.app.log.segments.SegmentFiles`)
    and the log writer process's flusher (:class:`~rlreplay.app.log.flushes.ProcessFlusher`);
    the fill buffers, the LSNs and the flush thread are its own. The flush thread is not a
    second flusher behind the process's interface but the path every flush can take and
    the first write, rotations and recovery from a failure must take; :meth:`commit` hands
    a flush to the process when it runs and nothing needs the thread (the
    :mod:`~rlreplay.app.log.flushes` docstring says why).

    Args:
        folder: Where the segment files live.
        io: The thread pool every file operation runs in.
        group_commit_s: Extra wait before a flush, to gather more records into it.
        direct: Write with ``O_DIRECT`` where the filesystem supports it (False: always
            buffered writes; the on-disk format is the same).
        in_use_mark: Where the log marks that it holds records no checkpoint covers
            (:mod:`rlreplay.app.log.in_use`; None: nowhere).
    """

    def __init__(
        self,
        folder: Path,
        *,
        io: BlockingIO,
        group_commit_s: float = 0.0,
        direct: bool = True,
        writer: Literal["auto", "process", "thread"] = "auto",
        in_use_mark: Path | None = None,
    ) -> None:
        self._io = io
        self._in_use_mark = in_use_mark  # see rlreplay.app.log.in_use (None: no mark)
        self._files = SegmentFiles(folder, io, direct=direct)
        self._group_commit_s = group_commit_s
        # Framed records appended, not yet written: page-aligned (O_DIRECT writes it as it
        # is), owned by the event loop; a flush takes it and a free one takes its place.
        self._fill: SharedBuffer | None = None
        self._fill_used = 0  # bytes of frames in _fill
        self._fill_count = 0  # records in _fill
        self._free: list[SharedBuffer] = []  # buffers written, ready for reuse
        # the log writer process and its flushes in flight
        self._process = ProcessFlusher(
            self._files,
            writer=writer if SUPPORTED else "thread",
            on_durable=self._durable,
            on_lost=self.refuse,
            recycle=self._recycle,
        )
        self._buffer_last_lsn = 0
        self._durable_lsn = 0
        # LSNs lost in failed flushes, oldest first: commit() raises for them, even once
        # later records are durable (the writer then drops their ops: nothing refused is applied)
        self._refused = Refusals()
        self.flush_failures = 0  # flushes that failed (counted in /metrics)
        self._written_upto = 0  # the last LSN the flush thread wrote and synced
        self.last_error: OSError | None = None  # the last flush's error; None once one succeeds
        self._next_lsn = 1
        # One packer for every record: msgpack.packb builds a Packer, and mallocs and frees
        # its 1 MiB buffer, per call, on the event loop (commit 841fd79 has the figure).
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=False)
        self._flushing: asyncio.Future[None] | None = None
        # set while rotate() drains the flushes in flight: commits wait instead of adding
        # more, which under steady load kept the drain (and the checkpoint) from ever ending
        self._rotating: asyncio.Future[None] | None = None
        self._region_peak = 0  # the largest region flushed since the last rotation
        self.bytes_since_checkpoint = 0

    # -- opening and replay -------------------------------------------------------------

    def replay(
        self, after_lsn: int, *, strict: bool = True, loss: DataLoss | None = None
    ) -> Iterator[list[Any]]:
        """Yield every whole record with LSN > ``after_lsn``, oldest first (blocking): the
        records of :meth:`replay_plan`, which it makes once iterated."""
        yield from self.replay_plan(after_lsn, strict=strict, loss=loss).records()

    def replay_plan(
        self, after_lsn: int, *, strict: bool = True, loss: DataLoss | None = None
    ) -> ReplayPlan:
        """Find every whole record with LSN > ``after_lsn`` (blocking), and return the plan
        that reads them back, a batch at a time; see
        :func:`~rlreplay.app.log.replay.plan_replay`. What is missing or damaged goes to
        ``loss`` (by default: raised, or with ``strict`` False replayed up to it), before
        any record is read back.

        The log then goes on after the plan's last record. Once anything was dropped, new
        LSNs go past every LSN on disk and the spare segments are deleted, so no record
        left behind is ever read as a new one."""
        self._files.lock()
        if loss is None:
            loss = DataLoss(wal_recovery="strict" if strict else "point-in-time")
        result = ReplayResult()
        folder = self._files.folder
        plan = plan_replay(folder, after_lsn, loss=loss, result=result, mark=self._in_use_mark)
        last = max(after_lsn, plan.last or 0)
        for name, path, seg_last in result.found:
            self._files.found(name, path, seg_last)
        if loss.lost:
            last = max(last, result.highest)
            drop_spares(self._files.folder)
        self._files.checkpoint_lsn = after_lsn
        self._next_lsn = last + 1
        self._durable_lsn = last
        return plan

    def open(self, min_lsn: int) -> None:
        """Start a fresh segment for new records; LSNs continue above ``min_lsn`` (blocking).
        The log is then marked in use (:mod:`rlreplay.app.log.in_use`) until a close finds
        every record it holds checkpointed."""
        self._next_lsn = max(self._next_lsn, min_lsn + 1)
        self._durable_lsn = self._buffer_last_lsn = self._next_lsn - 1
        self._files.open(self._next_lsn)
        if self._in_use_mark is not None:
            mark_in_use(self._in_use_mark)

    async def truncate(self, covered_lsn: int) -> None:
        """Delete the segments whose every record has LSN ≤ ``covered_lsn``."""
        await self._files.truncate(covered_lsn)

    def disk_bytes(self) -> int:
        """Bytes of log on disk (approximate: sizes of the segment files, spares included)."""
        return self._files.disk_bytes()

    # -- appending ----------------------------------------------------------------------

    @property
    def folder(self) -> Path:
        """Where the segment files live."""
        return self._files.folder

    @property
    def durable_lsn(self) -> int:
        """The last LSN fsynced (every one before it is fsynced or refused)."""
        return self._durable_lsn

    @property
    def next_lsn(self) -> int:
        """The LSN the next record gets."""
        return self._next_lsn

    def append(self, body: list[Any], blob: bytes | memoryview | None = None) -> int:
        """Frame one record into the buffer: ``[lsn, *body]``, or with ``blob``
        ``[lsn, *body, blob]`` (a bin), the blob copied once, straight into the buffer.
        Returns its LSN.

        The record is packed and framed whole before its LSN is taken: one that cannot be
        packed (an integer past 64 bits, say) raises and leaves neither a gap in the LSNs
        nor a byte in the buffer.
        """
        lsn = self._next_lsn
        packer = self._packer
        try:
            if blob is None:
                packer.pack([lsn, *body])
            else:
                packer.pack_array_header(len(body) + 2)
                packer.pack(lsn)
                for element in body:
                    packer.pack(element)
            with packer.getbuffer() as head:
                head_size = len(head)
                size = head_size if blob is None else head_size + BIN32.size + len(blob)
                start = self._fill_used
                end = start + FRAME.size + size
                buf = self._fill
                if buf is None or len(buf) < region_size(end):
                    buf = self._grow(end)
                region = buf.map
                at = start + FRAME.size
                region[at : at + head_size] = head
        finally:
            packer.reset()
        with memoryview(region) as view:
            if blob is None:
                checksum = xxh3_64_intdigest(view[start + FRAME.size : end])
            else:
                at += head_size
                BIN32.pack_into(region, at, 0xC6, len(blob))
                at += BIN32.size
                if len(blob) < HASH_WHILE_COPYING_BYTES:
                    region[at:end] = blob
                    checksum = xxh3_64_intdigest(view[start + FRAME.size : end])
                else:
                    checksum = _copy_hashed(view, start + FRAME.size, at, blob)
        FRAME.pack_into(region, start, size, checksum)
        self._next_lsn = lsn + 1
        self._fill_used = end
        self._fill_count += 1
        self._buffer_last_lsn = lsn
        self.bytes_since_checkpoint += FRAME.size + size
        return lsn

    def _grow(self, framed: int) -> SharedBuffer:
        """The fill buffer, replaced by one (a free one, or a new one of _BUFFER_BYTES
        doubled until it fits) whose region for ``framed`` bytes of frames fits; what it
        held is copied over."""
        need, old = region_size(framed), self._fill
        new = next((b for b in self._free if len(b) >= need), None)
        if new is not None:
            self._free.remove(new)
        else:
            capacity = _BUFFER_BYTES
            while capacity < need:
                capacity *= 2
            new = SharedBuffer(capacity)  # page aligned, as O_DIRECT needs
        if old is not None:
            new.map[: self._fill_used] = old.map[: self._fill_used]
            self._recycle(old)
        self._fill = new
        return new

    def _recycle(self, buf: SharedBuffer) -> None:
        """``buf`` is free again: kept for the next flushes, or dropped if enough are."""
        if len(self._free) < MAX_IN_FLIGHT + 1:
            self._free.append(buf)
        else:
            self._drop(buf)

    def _drop(self, buf: SharedBuffer) -> None:
        self._process.forget(buf)
        buf.release()

    def _durable(self, upto: int, padding: int) -> None:
        """A flush made the records up to LSN ``upto`` durable, with ``padding`` bytes."""
        self._durable_lsn = max(self._durable_lsn, upto)
        self.bytes_since_checkpoint += padding
        self.last_error = None

    def _submit(self) -> None:
        """Hand the fill buffer to the log writer process (no await: nothing interleaves)."""
        buf = self._fill
        assert buf is not None
        size = self._process.submit(buf, self._fill_used, self._fill_count, self._buffer_last_lsn)
        if size is None:  # the process is gone: the records stay here, for the thread
            return
        self._region_peak = max(self._region_peak, size)
        self._fill = self._free.pop() if self._free else None
        self._fill_used = self._fill_count = 0

    async def commit(self, lsn: int) -> None:
        """Return once the record ``lsn`` (and every one before it) is fsynced.

        Raises the flush's OSError if the flush that held the record failed: the record is
        then refused for good (the caller's write is not applied), even after later records
        are durable.
        """
        while True:
            if self._refused:
                refusal = self.refusal(lsn)
                if refusal is not None:
                    raise OSError(refusal.error.errno, refusal.error.strerror) from refusal.error
            if self._durable_lsn >= lsn:
                return
            if self._rotating is not None:  # the rotation's own flush takes this record
                await asyncio.wait({self._rotating})
                continue
            if self._flushing is not None:
                await asyncio.wait({self._flushing})
                continue
            process = self._process
            if lsn <= process.submitted_lsn:  # with the process: wait for the flush with it
                holder = process.holder(lsn)
                if holder is None:  # not durable and no longer in flight: its flush failed
                    raise OSError(errno.EIO, f"the log flush holding record {lsn} failed")
                await asyncio.wait({holder})
                continue
            if self._group_commit_s:
                await asyncio.sleep(self._group_commit_s)
                if self._flushing is not None or self._durable_lsn >= lsn:
                    continue
                if lsn <= process.submitted_lsn:
                    continue
            if process.use() and self._files.fits(region_size(self._fill_used)):
                if len(process.in_flight) < MAX_IN_FLIGHT:
                    self._submit()
                else:
                    await asyncio.wait({process.in_flight[0].done})
                continue
            if process.in_flight:  # back to the thread: the process's flushes end first
                await asyncio.wait({process.in_flight[-1].done})
                continue
            try:
                await self._flush_once()
            except OSError:
                continue  # the record's refusal, or a later one's: the loop's top tells

    async def drain(self) -> None:
        """Wait until no flush is in flight (failed ones included, without raising)."""
        in_flight = self._process.in_flight
        while in_flight or self._flushing is not None:
            pending = in_flight[-1].done if in_flight else self._flushing
            assert pending is not None
            await asyncio.wait({pending})

    def refusal(self, lsn: int) -> Refusal | None:
        """The failed flush that lost record ``lsn``, if one did."""
        return self._refused.find(lsn)

    def refuse(self, first: int, last: int, error: BaseException) -> None:
        """Records ``first``..``last`` were lost in a failed flush (a single record already
        known refused is left as it is)."""
        if first > last or (first == last and self.refusal(first) is not None):
            return
        if not isinstance(error, OSError):
            error = OSError(errno.EIO, repr(error))
        self.flush_failures += 1
        self.last_error = error
        log.error("write-ahead log: a flush of records %d-%d failed: %s", first, last, error)
        self._refused.add(first, last, error)

    # -- flushing in a thread -----------------------------------------------------------

    async def _flush_once(self, *, rotate: bool = False) -> None:
        """Write and fsync the fill buffer in the flush thread (then rotate, if asked).
        One runs at a time and never beside the process's flushes: ``_flushing`` is set
        before the first await, so every file operation is ordered.

        The fill buffer goes to the I/O thread whole, and appends meanwhile go to a free
        one; afterwards (written or not) it is free again.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._flushing = fut
        buf, used, count, upto = None, self._fill_used, self._fill_count, self._buffer_last_lsn
        if count:
            buf = self._fill
            self._fill = self._free.pop() if self._free else None
            self._fill_used = self._fill_count = 0
            self._region_peak = max(self._region_peak, region_size(used))
        try:
            try:
                padding = await self._io.run(
                    self._write_sync, None if buf is None else buf.map, used, count, upto, rotate
                )
            except BaseException as exc:
                if (
                    count and self._written_upto == upto
                ):  # the records are on disk; the rotation failed
                    self._durable_lsn = max(self._durable_lsn, upto)
                    self.flush_failures += 1
                    if isinstance(exc, OSError):
                        self.last_error = exc
                elif count:
                    self.refuse(upto - count + 1, upto, exc)
                else:
                    self.flush_failures += 1
                    if isinstance(exc, OSError):
                        self.last_error = exc
                raise
            self._durable(upto, padding)
            await self._process.thread_flushed(self._io)
            fut.set_result(None)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: waiters get it through shield
            raise
        finally:
            self._flushing = None
            if buf is not None:
                self._recycle(buf)

    def _write_sync(
        self, buf: mmap.mmap | None, used: int, count: int, upto: int, rotate: bool = False
    ) -> int:
        """Write the ``count`` frames in ``buf[:used]`` (the records up to LSN ``upto``) as one
        region and fdatasync; then rotate if asked. Returns the bytes of padding written.

        A failure may leave half a region in the segment and a gap in the LSNs (those
        records are lost, their writers told so): the next flush starts a new segment.
        """
        files = self._files
        try:
            padding = 0
            if count:
                assert buf is not None
                if files.failed:
                    # the new segment is named after the first LSN not durable: records
                    # at or past it that the failed flush left in the old one are void
                    files.rotate(self._durable_lsn + 1)
                padding = files.write_records(buf, used, upto)
                self._written_upto = upto
            if rotate:
                files.rotate(upto + 1 if count else self._durable_lsn + 1)
            return padding
        except BaseException:
            files.failed = True
            raise

    async def sync(self) -> None:
        """Fsync everything appended so far."""
        await self.commit(self._next_lsn - 1)

    # -- checkpoints --------------------------------------------------------------------

    async def rotate(self) -> None:
        """Write and fsync what is buffered, close the segment and start a new one.

        Free buffers bigger than twice the largest region flushed since the last rotation
        (a burst grew them) are given back; the next append allocates a smaller one.
        """
        self.bytes_since_checkpoint = 0
        rotating = self._rotating = asyncio.get_running_loop().create_future()
        try:
            await self.drain()
            await self._flush_once(rotate=True)  # no await since drain: nothing came in flight
        finally:
            self._rotating = None
            rotating.set_result(None)
        limit = max(_BUFFER_BYTES, 2 * self._region_peak)
        self._region_peak = 0
        for buf in [b for b in self._free if len(b) > limit]:
            self._free.remove(buf)
            self._drop(buf)
        if self._fill is not None and not self._fill_used and len(self._fill) > limit:
            self._drop(self._fill)
            self._fill = None

    def _checkpointed(self) -> bool:
        """Whether the last checkpoint covers every record the log was given."""
        return self._files.checkpoint_lsn >= self._next_lsn - 1

    def close(self) -> None:
        """Stop the log writer process, flush the buffer, fsync and close (blocking);
        idempotent. Call :meth:`drain` first: flushes still in flight are not waited for
        (the process finishes them before it exits, but they are not counted durable)."""
        in_flight = bool(self._process.in_flight)
        if in_flight:
            log.warning(
                "write-ahead log closed with %d flushes in flight", len(self._process.in_flight)
            )
        self._process.close()
        files = self._files
        if files.fd is not None:
            try:
                if self._fill_count and self._fill is not None:
                    # records no caller waits for any more (its request was cancelled)
                    self._write_sync(
                        self._fill.map, self._fill_used, self._fill_count, self._buffer_last_lsn
                    )
                    self._fill_used = self._fill_count = 0
                files.seal()  # after a failed flush, replay stops at its torn region
                mark = self._in_use_mark
                if mark is not None and not in_flight and not files.failed and self._checkpointed():
                    mark_not_needed(mark)
            except OSError as exc:  # nothing answered is lost: answers waited for fsyncs
                log.error("write-ahead log in %s: the last write failed: %s", files.folder, exc)
        for buf in [*self._free, *([self._fill] if self._fill is not None else [])]:
            buf.release()
        self._fill, self._free = None, []
        files.close()


def _copy_hashed(view: memoryview, start: int, at: int, blob: bytes | memoryview) -> int:
    """Copies ``blob`` into ``view`` at ``at``; returns the xxh3_64 of ``view[start:at]`` (what
    precedes it: the record's head) and the blob, each step hashed just after its copy."""
    hasher = xxh3_64(view[start:at])
    source = memoryview(blob)
    for step in range(0, len(source), _COPY_STEP):
        part = source[step : step + _COPY_STEP]
        target = view[at + step : at + step + len(part)]
        target[:] = part
        hasher.update(target)
    return hasher.intdigest()
