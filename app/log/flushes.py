"""Log flushes through the log writer process (:mod:`rlreplay.app.log.writer_process`).

``append`` frames records into a page-aligned shared buffer; the process writes and
fdatasyncs it (up to ``MAX_IN_FLIGHT`` flushes at a time) while the next buffer fills, so
the event loop hands over no GIL between a flush's system calls. The flush thread does the
first write (it settles ``O_DIRECT``), rotations, the flushes after a failure, and every
flush with ``writer="thread"``; only one of the two writes at a time.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlreplay.app.log.framing import ZEROS, region_size
from rlreplay.app.log.writer_process import LogWriterProcess, SharedBuffer

if TYPE_CHECKING:
    from pathlib import Path

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


class ProcessFlushes:
    """The part of :class:`~rlreplay.app.log.wal.WriteAheadLog` that feeds the log writer process
    (a base class of it: the state below is the log's, set up by its constructor)."""

    _folder: Path
    _writer: str
    _proc: LogWriterProcess | None
    _failed: bool
    _fd: int | None
    _direct: bool | None
    _thread_flushes: int
    _lock_fd: int | None
    _fill: SharedBuffer | None
    _fill_used: int
    _fill_count: int
    _free: list[SharedBuffer]
    _buffer_last_lsn: int
    _segment_token: object
    _in_flight: deque[Flush]
    _submitted_lsn: int
    _offset: int
    _region_peak: int
    _segments: list[tuple[int, Path]]
    _segment_last_lsn: dict[Path, int]
    _durable_lsn: int
    bytes_since_checkpoint: int
    last_error: OSError | None

    def _recycle(self, buf: SharedBuffer) -> None:
        raise NotImplementedError  # the log's

    def refuse(self, first: int, last: int, error: BaseException) -> None:
        raise NotImplementedError  # the log's

    def _use_process(self) -> bool:
        """Whether the next flush goes to the log writer process."""
        return self._proc is not None and not self._failed and self._fd is not None

    def _process_due(self) -> bool:
        """Whether to start the log writer process now (after a flush in the thread)."""
        return (
            self._proc is None
            and self._writer != "thread"
            and not self._failed
            and self._direct is not None  # the first write settles O_DIRECT, in the thread
            and (self._writer == "process" or self._thread_flushes >= PROCESS_AFTER_FLUSHES)
        )

    def _start_process(self) -> LogWriterProcess | None:
        """Start the log writer process (blocking: fork and exec); None if it cannot be."""
        assert self._lock_fd is not None
        try:
            proc = LogWriterProcess(keep_fds=(self._lock_fd,))
        except OSError as exc:
            log.warning("no log writer process (%s): flushing in a thread", exc)
            self._writer = "thread"
            return None
        log.info("write-ahead log in %s: flushes in a log writer process", self._folder)
        return proc

    def _submit(self) -> None:
        """Hand the fill buffer to the process (no await: nothing interleaves)."""
        assert self._proc is not None and self._fd is not None
        buf, used, upto = self._fill, self._fill_used, self._buffer_last_lsn
        assert buf is not None
        size = region_size(used)
        buf.map[used:size] = ZEROS[: size - used]
        try:
            self._proc.ensure(buf, self._fd, self._segment_token)
            number = self._proc.write(buf, size, self._offset)
        except OSError as exc:
            self._lose_process(exc)  # the records stay in the fill buffer, for the thread
            return
        loop = asyncio.get_running_loop()
        first = upto - self._fill_count + 1
        self._in_flight.append(Flush(number, first, upto, buf, size - used, loop.create_future()))
        self._submitted_lsn = upto
        self._offset += size
        self._region_peak = max(self._region_peak, size)
        self._fill = self._free.pop() if self._free else None
        self._fill_used = self._fill_count = 0
        if len(self._in_flight) == 1:  # replies are read while flushes are in flight
            loop.add_reader(self._proc.fileno(), self._on_replies)

    def _on_replies(self) -> None:
        """The process answered (an event loop reader callback)."""
        assert self._proc is not None
        try:
            replies = self._proc.replies()
        except OSError as exc:
            self._lose_process(exc)
            return
        segment = self._segments[-1][1]  # no rotation while flushes are in flight
        for reply in replies:
            while self._in_flight and self._in_flight[0].number <= reply.number:
                flush = self._in_flight.popleft()
                if reply.error is None:
                    self._durable_lsn = max(self._durable_lsn, flush.upto)
                    self._segment_last_lsn[segment] = flush.upto
                    self.bytes_since_checkpoint += flush.padding
                    self.last_error = None
                    flush.done.set_result(None)
                else:  # lost, and so is every later one: the next flush starts a new segment
                    self._failed = True
                    self.refuse(flush.first, flush.upto, reply.error)
                    flush.done.set_exception(reply.error)
                    flush.done.exception()  # retrieved: waiters get it through shield
                self._recycle(flush.buf)
        if not self._in_flight:
            asyncio.get_running_loop().remove_reader(self._proc.fileno())

    def _lose_process(self, exc: BaseException) -> None:
        """The process is gone: fail its flushes, go on with the flush thread."""
        log.warning("log writer process lost (%s): flushing in a thread from now on", exc)
        proc, self._proc, self._writer = self._proc, None, "thread"
        if proc is not None and self._in_flight:
            asyncio.get_running_loop().remove_reader(proc.fileno())
        if self._in_flight:
            self._failed = True  # some of them may be half written
        while self._in_flight:
            flush = self._in_flight.popleft()
            error = OSError(errno.EIO, f"log writer process lost: {exc}")
            self.refuse(flush.first, flush.upto, error)
            flush.done.set_exception(error)
            flush.done.exception()
            flush.buf.release()
        if proc is not None:
            proc.abandon()
