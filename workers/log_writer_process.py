"""The log writer process: writes and fdatasyncs the write-ahead log's regions for it.

Why a process: a flush thread in the server needs the GIL between its system calls, and
each hand-over of the GIL between it and the event loop costs a context switch on both
sides, which slows the event loop's pushes. Here the event loop only sends a 33-byte
request per flush and reads a reply; the bytes themselves travel in shared memory. The
``--wal-writer thread`` arm of ``python -m bench fast_paths`` measures the difference
(``docs/benchmarks.md``, "Fast paths").

Protocol, over a ``SOCK_SEQPACKET`` socket pair (one message per request or reply):

* ``BUFFER id size`` with a memfd attached: map it as buffer ``id``.
* ``FORGET id``: unmap buffer ``id``.
* ``SEGMENT`` with a file descriptor attached: write to this file from now on.
* ``WRITE id size offset number``: write ``buffer[:size]`` at ``offset``, fdatasync, then
  reply ``OK number``. Writes waiting in the socket are done together: one ``pwrite`` each,
  then one ``fdatasync`` for all, then one reply naming the last one.
* A failed write is answered ``FAILED number errno message``, and so is every later write
  until the next ``SEGMENT`` (a segment must not go on after a gap).

The parent's end closing is the signal to exit, after the writes already sent.
"""

from __future__ import annotations

import array
import errno
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass

REQUEST = struct.Struct("<BIQQQ")  # op, buffer id, size, offset, number
REPLY = struct.Struct("<BQi")  # status, number of the last write covered, errno
OP_WRITE, OP_BUFFER, OP_FORGET, OP_SEGMENT = range(4)
OK, FAILED = 0, 1
_FDS_SPACE = socket.CMSG_SPACE(array.array("i").itemsize)

#: Whether this platform can run the log writer process (memfd and descriptor passing).
SUPPORTED = hasattr(os, "memfd_create") and hasattr(socket, "send_fds")


@dataclass(slots=True)
class Reply:
    """What the process answered: the writes up to ``number`` are durable, or failed."""

    number: int
    error: OSError | None


class SharedBuffer:
    """A page-aligned buffer another process can map: a memfd where the platform has them,
    else anonymous memory (usable by the flush thread only)."""

    __slots__ = ("fd", "id", "map")

    _next_id = 1

    def __init__(self, size: int) -> None:
        self.id = SharedBuffer._next_id
        SharedBuffer._next_id += 1
        if SUPPORTED:
            self.fd: int | None = os.memfd_create("rlreplay-wal", os.MFD_CLOEXEC)
            try:
                os.ftruncate(self.fd, size)
                self.map = mmap.mmap(self.fd, size)
            except BaseException:
                os.close(self.fd)
                raise
        else:
            self.fd = None
            self.map = mmap.mmap(-1, size)

    def __len__(self) -> int:
        return len(self.map)

    def release(self) -> None:
        """Close the memfd. The mapping is not closed: a view of it in a failed write's
        traceback may outlive the buffer; it goes when the last reference does."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class LogWriterProcess:
    """The parent's end: starts the process, sends it buffers, segments and writes."""

    def __init__(self, *, keep_fds: tuple[int, ...] = ()) -> None:
        """``keep_fds`` stay open in the process for its lifetime (the log's lock)."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "rlreplay.workers.log_writer_process", str(child.fileno())],
                pass_fds=[child.fileno(), *keep_fds],
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        parent.setblocking(False)  # requests are tiny and few: sends never wait
        self._sock = parent
        self._known: set[int] = set()  # buffer ids the process has mapped
        self._segment_token: object | None = None
        self.next_number = 1

    def fileno(self) -> int:
        """The socket to watch for replies."""
        return self._sock.fileno()

    def ensure(self, buf: SharedBuffer, segment_fd: int, segment_token: object) -> None:
        """Send ``buf`` and the segment (``segment_token`` names the open file) if the
        process does not have them yet."""
        if buf.id not in self._known:
            assert buf.fd is not None
            socket.send_fds(self._sock, [REQUEST.pack(OP_BUFFER, buf.id, len(buf), 0, 0)], [buf.fd])
            self._known.add(buf.id)
        if segment_token is not self._segment_token:
            socket.send_fds(self._sock, [REQUEST.pack(OP_SEGMENT, 0, 0, 0, 0)], [segment_fd])
            self._segment_token = segment_token

    def forget(self, buf: SharedBuffer) -> None:
        """Tell the process to unmap ``buf`` (no-op if it never had it)."""
        if buf.id in self._known:
            self._known.discard(buf.id)
            self._sock.send(REQUEST.pack(OP_FORGET, buf.id, 0, 0, 0))

    def write(self, buf: SharedBuffer, size: int, offset: int) -> int:
        """Ask for ``buf[:size]`` at ``offset`` and an fdatasync; returns the write's number."""
        number = self.next_number
        self.next_number += 1
        self._sock.send(REQUEST.pack(OP_WRITE, buf.id, size, offset, number))
        return number

    def replies(self) -> list[Reply]:
        """The replies waiting (the socket is non-blocking); raises ConnectionError if the
        process is gone."""
        out: list[Reply] = []
        while True:
            try:
                msg = self._sock.recv(4096)
            except BlockingIOError:
                return out
            if not msg:
                raise ConnectionError("the log writer process exited")
            status, number, code = REPLY.unpack_from(msg)
            error = None
            if status != OK:
                text = msg[REPLY.size :].decode(errors="replace")
                error = OSError(code or errno.EIO, f"log writer: {text}")
            out.append(Reply(number, error))

    def close(self, timeout: float = 30.0) -> None:
        """Close our end (the process finishes the writes sent, then exits) and wait."""
        self._sock.close()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def kill(self) -> None:
        """Kill the process (as the OOM killer would) and wait for it; the socket stays
        open, so the parent finds out as it would in production."""
        self._proc.kill()
        self._proc.wait()

    def abandon(self) -> None:
        """Kill the process and close our end: it is of no more use."""
        self.kill()
        self._sock.close()


# -- the process ---------------------------------------------------------------------------


def serve(sock: socket.socket) -> None:
    """The log writer's loop (runs in the child process)."""
    maps: dict[int, mmap.mmap] = {}
    segment: int | None = None
    failed: OSError | None = None
    while True:
        try:
            msg, fds = _receive(sock)
        except ConnectionError:
            return
        if not msg:
            return
        writes: list[tuple[int, int, int, int]] = []
        while True:
            op, buf_id, size, offset, number = REQUEST.unpack(msg)
            if op == OP_WRITE:
                writes.append((buf_id, size, offset, number))
            else:
                if writes:  # keep the order: what came before this message goes first
                    failed = _write(sock, maps, segment, writes, failed)
                    writes = []
                if op == OP_BUFFER:
                    maps[buf_id] = mmap.mmap(fds[0], size)
                    os.close(fds[0])
                elif op == OP_FORGET:
                    old = maps.pop(buf_id, None)
                    if old is not None:
                        old.close()
                elif op == OP_SEGMENT:
                    if segment is not None:
                        os.close(segment)
                    segment, failed = fds[0], None
            try:  # more requests already waiting: take them into the same fdatasync
                msg, fds = _receive(sock, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except ConnectionError:
                msg = b""
            if not msg:
                if writes:
                    _write(sock, maps, segment, writes, failed)
                return
        if writes:
            failed = _write(sock, maps, segment, writes, failed)


def _receive(sock: socket.socket, flags: int = 0) -> tuple[bytes, list[int]]:
    """One request and the descriptors that came with it. (``socket.recv_fds`` of Python
    3.11 drops its ``flags`` argument, so MSG_DONTWAIT has to go through recvmsg.)"""
    msg, ancillary, _flags, _addr = sock.recvmsg(REQUEST.size, _FDS_SPACE, flags)
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return msg, list(fds)


def _write(
    sock: socket.socket,
    maps: dict[int, mmap.mmap],
    segment: int | None,
    writes: list[tuple[int, int, int, int]],
    failed: OSError | None,
) -> OSError | None:
    """Do ``writes`` and one fdatasync, reply; returns the failure that stops the segment."""
    last = writes[-1][3]
    if failed is None:
        try:
            if segment is None:
                raise OSError(errno.EBADF, "no segment")
            for buf_id, size, offset, _number in writes:
                view = memoryview(maps[buf_id])[:size]
                while view:
                    written = os.pwrite(segment, view, offset)
                    if written <= 0:
                        raise OSError(errno.EIO, "pwrite wrote nothing")
                    view, offset = view[written:], offset + written
            os.fdatasync(segment)
        except OSError as exc:
            failed = exc
        except Exception as exc:  # a bug here must not look like success
            failed = OSError(errno.EIO, repr(exc))
    if failed is None:
        sock.send(REPLY.pack(OK, last, 0))
    else:
        text = (failed.strerror or str(failed)).encode()[:1000]
        sock.send(REPLY.pack(FAILED, last, failed.errno or errno.EIO) + text)
    return failed


if __name__ == "__main__":
    # Ctrl-C and a SIGTERM to the group are the server's to handle: it drains the log and
    # closes the socket, and that is when this process exits
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(socket.socket(fileno=int(sys.argv[1])))
