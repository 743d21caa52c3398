"""Log flushes through the log writer process (:mod:`rlreplay.workers.log_writer_process`), which
:class:`~rlreplay.app.log.wal.WriteAheadLog` holds as a :class:`ProcessFlusher`.

``append`` frames records into a page-aligned shared buffer; the process writes and
fdatasyncs it (up to ``MAX_IN_FLIGHT`` flushes at a time) while the next buffer fills, so
the event loop hands over no GIL between a flush's system calls.

There is one flusher, not a thread flusher and a process flusher behind one interface: the
log's flush thread (``WriteAheadLog._flush_once``, one ``BlockingIO`` call) is not an
alternative to the process but the path every log has and needs. It does the first write
(which settles ``O_DIRECT``), every rotation (a checkpoint's, which must come after the
process's flushes in flight and before the next), the flushes after a failure or once the
process is lost, and every flush with ``writer="thread"`` or where descriptor passing is
missing. The process is an accelerator the log starts once it is busy
(:meth:`ProcessFlusher.thread_flushed`) and stops using when it fails; only one of the two
writes at a time, and :meth:`WriteAheadLog.commit` chooses, flush by flush, which.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rlreplay.app.log.framing import ZEROS, region_size
from rlreplay.app.log.segments import SegmentFiles
from rlreplay.workers.blocking import BlockingIO
from rlreplay.workers.log_writer_process import LogWriterProcess, SharedBuffer

log = logging.getLogger("rlreplay.app.log.wal")

MAX_IN_FLIGHT = 3  # flushes handed to the log writer process and not answered yet
PROCESS_AFTER_FLUSHES = 64  # writer="auto": the process starts once the log is this busy


@dataclass(slots=True)
class Flush:
    """A flush the log writer process was asked for."""

    number: int
    first: int  # its first LSN
    upto: int  # its last LSN
    buf: SharedBuffer
    padding: int
    done: asyncio.Future[None]


class ProcessFlusher:
    """Feeds the log writer process the log's filled buffers and reads its replies.

    Args:
        files: The segment files the process writes into (its descriptor and offsets).
        writer: ``"auto"``, ``"process"`` or ``"thread"`` (never starts the process).
        on_durable: Called with ``(upto, padding)`` when a flush's records, up to LSN
            ``upto``, are durable (``padding``: the bytes of padding it wrote).
        on_lost: Called with ``(first, last, error)`` when a flush's records are lost.
        recycle: Called with a flush's buffer once the process is done with it.
    """

    def __init__(
        self,
        files: SegmentFiles,
        *,
        writer: str,
        on_durable: Callable[[int, int], None],
        on_lost: Callable[[int, int, BaseException], None],
        recycle: Callable[[SharedBuffer], None],
    ) -> None:
        self._files = files
        self._on_durable = on_durable
        self._on_lost = on_lost
        self._recycle = recycle
        self.writer = writer
        self.proc: LogWriterProcess | None = None  # None: not started, or gone
        self.in_flight: deque[Flush] = deque()  # flushes handed over, oldest first
        self.submitted_lsn = 0  # the last LSN handed to the process
        self.thread_flushes = 0  # flushes the thread did (the process starts after enough)

    def use(self) -> bool:
        """Whether the next flush goes to the log writer process."""
        files = self._files
        return self.proc is not None and not files.failed and files.fd is not None

    def due(self) -> bool:
        """Whether to start the log writer process now (after a flush in the thread)."""
        return (
            self.proc is None
            and self.writer != "thread"
            and not self._files.failed
            and self._files.direct is not None  # the first write settles O_DIRECT, in the thread
            and (self.writer == "process" or self.thread_flushes >= PROCESS_AFTER_FLUSHES)
        )

    async def thread_flushed(self, io: BlockingIO) -> None:
        """The flush thread made a flush durable: the process starts once the log has been
        busy enough (off the event loop, while no flush can begin)."""
        self.thread_flushes += 1
        if self.due():
            self.proc = await io.run(self.start)

    def start(self) -> LogWriterProcess | None:
        """Start the log writer process (blocking: fork and exec); None if it cannot be."""
        assert self._files.lock_fd is not None
        try:
            proc = LogWriterProcess(keep_fds=(self._files.lock_fd,))
        except OSError as exc:
            log.warning("no log writer process (%s): flushing in a thread", exc)
            self.writer = "thread"
            return None
        log.info("write-ahead log in %s: flushes in a log writer process", self._files.folder)
        return proc

    def holder(self, lsn: int) -> asyncio.Future[None] | None:
        """The flush in flight that holds record ``lsn`` (None: none does)."""
        return next((f.done for f in self.in_flight if f.upto >= lsn), None)

    def submit(self, buf: SharedBuffer, used: int, count: int, upto: int) -> int | None:
        """Hand ``buf`` (``count`` records up to LSN ``upto`` in its first ``used`` bytes) to
        the process (no await: nothing interleaves); returns the size of its region, or
        None if the process is gone (the records stay in the buffer, for the thread)."""
        files = self._files
        assert self.proc is not None and files.fd is not None
        size = region_size(used)
        buf.map[used:size] = ZEROS[: size - used]
        try:
            self.proc.ensure(buf, files.fd, files.segment_token)
            number = self.proc.write(buf, size, files.offset)
        except OSError as exc:
            self._lose_process(exc)
            return None
        loop = asyncio.get_running_loop()
        first = upto - count + 1
        self.in_flight.append(Flush(number, first, upto, buf, size - used, loop.create_future()))
        self.submitted_lsn = upto
        files.reserve(size)
        if len(self.in_flight) == 1:  # replies are read while flushes are in flight
            loop.add_reader(self.proc.fileno(), self._on_replies)
        return size

    def forget(self, buf: SharedBuffer) -> None:
        """The log drops ``buf``: the process unmaps it too."""
        if self.proc is not None:
            try:
                self.proc.forget(buf)
            except OSError:
                pass  # the process is gone: the next submit finds out

    def close(self) -> None:
        """Stop the process, after the writes it was sent (blocking); idempotent."""
        if self.proc is not None:
            self.proc.close()
            self.proc = None

    def _on_replies(self) -> None:
        """The process answered (an event loop reader callback)."""
        assert self.proc is not None
        try:
            replies = self.proc.replies()
        except OSError as exc:
            self._lose_process(exc)
            return
        for reply in replies:  # no rotation while flushes are in flight: one segment
            while self.in_flight and self.in_flight[0].number <= reply.number:
                flush = self.in_flight.popleft()
                if reply.error is None:
                    self._files.wrote(flush.upto)
                    self._on_durable(flush.upto, flush.padding)
                    flush.done.set_result(None)
                else:  # lost, and so is every later one: the next flush starts a new segment
                    self._files.failed = True
                    self._on_lost(flush.first, flush.upto, reply.error)
                    flush.done.set_exception(reply.error)
                    flush.done.exception()  # retrieved: waiters get it through shield
                self._recycle(flush.buf)
        if not self.in_flight:
            asyncio.get_running_loop().remove_reader(self.proc.fileno())

    def _lose_process(self, exc: BaseException) -> None:
        """The process is gone: fail its flushes, go on with the flush thread."""
        log.warning("log writer process lost (%s): flushing in a thread from now on", exc)
        proc, self.proc, self.writer = self.proc, None, "thread"
        if proc is not None and self.in_flight:
            asyncio.get_running_loop().remove_reader(proc.fileno())
        if self.in_flight:
            self._files.failed = True  # some of them may be half written
        while self.in_flight:
            flush = self.in_flight.popleft()
            error = OSError(errno.EIO, f"log writer process lost: {exc}")
            self._on_lost(flush.first, flush.upto, error)
            flush.done.set_exception(error)
            flush.done.exception()
            flush.buf.release()
        if proc is not None:
            proc.abandon()
