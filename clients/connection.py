"""One TCP connection as an asyncio buffered protocol, with the few stream reads HTTP needs.

asyncio's ``StreamReader`` copies a large body three times in small steps; this protocol lets
the socket read a long body straight into a buffer of its size, which is what makes
:class:`~rlreplay.clients.transport.LeanTransport` cheap on multi-MiB answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Final, cast

from rlreplay.clients.http11 import BODY_PIECE, MAX_HEADER_BYTES
from rlreplay.wire.buffer_pool import BufferPool

__all__ = ["Connection"]

_SCRATCH_BYTES: Final = 64 * 1024
_WRITE_HIGH: Final = 64 * 1024  # asyncio's default high-water mark
#: A long body wakes its reader once, when complete, rather than on every read from the
#: socket (off: on every read; ``python -m bench.bulk --arms`` compares the two).
WAKE_ON_BODY = True
_SCRATCH_PAUSE: Final = MAX_HEADER_BYTES + BODY_PIECE  # unread bytes before reads pause
#: ``SO_SNDBUF`` of a connection over a Unix socket (0: the system's): such a socket holds
#: only what its sender's buffer does, ~208 KiB by default, so a long body crossed in some
#: 80 rounds of wake-ups of both sides (see ``rlreplay.app.api.unix_socket``, the server's).
UNIX_SEND_BUFFER_BYTES = 1 << 20


class Connection(asyncio.BufferedProtocol):
    """One TCP connection: a buffered protocol with the few stream operations HTTP needs.

    Bytes arrive in a small scratch buffer (heads, chunk sizes, short bodies). While
    :meth:`readexactly` waits for a long body, the socket reads straight into a buffer of the
    body's size, which it returns: a 1 MiB answer is copied once, from the kernel (asyncio's
    ``StreamReader`` copies it three times, in 256 KiB steps).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, buffers: BufferPool | None = None) -> None:
        self._loop = loop
        self._buffers = buffers
        self._transport: asyncio.Transport | None = None
        self._scratch = bytearray(_SCRATCH_BYTES)
        self._start = 0  # the unread bytes are _scratch[_start:_end]
        self._end = 0
        self._body: bytearray | memoryview | None = None  # where readexactly() wants them
        self._body_filled = 0
        self._waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._read_paused = False
        self._eof = False
        self._error: Exception | None = None
        self._closed: asyncio.Future[None] = loop.create_future()
        self.reused = False  # True once it has served a complete answer
        self.idle_since = 0.0

    # --- asyncio.BufferedProtocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # no isinstance check: uvloop's transports do not derive from asyncio's classes
        self._transport = cast("asyncio.Transport", transport)
        # a writer paused resumes once the transport's buffer is empty: its next write then
        # goes to the socket from where it lies, not appended (copied) behind the rest
        self._transport.set_write_buffer_limits(high=_WRITE_HIGH, low=0)
        sock = transport.get_extra_info("socket")
        if UNIX_SEND_BUFFER_BYTES and sock is not None and sock.family == socket.AF_UNIX:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BUFFER_BYTES)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None and self._body_filled < len(self._body):
            return memoryview(self._body)[self._body_filled :]
        if self._end == len(self._scratch):
            if self._start:  # move the unread bytes to the front
                unread = self._end - self._start
                self._scratch[:unread] = self._scratch[self._start : self._end]
                self._start, self._end = 0, unread
            else:  # full of unread bytes: grow; buffer_updated pauses reading
                self._scratch.extend(bytes(_SCRATCH_BYTES))
        return memoryview(self._scratch)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._body is not None and self._body_filled < len(self._body):
            self._body_filled += nbytes
            if self._body_filled < len(self._body) and WAKE_ON_BODY:
                return  # readexactly() waits for the whole body: one wake, not one a read
        else:
            self._end += nbytes
            if self._end - self._start > _SCRATCH_PAUSE and self._transport is not None:
                self._transport.pause_reading()
                self._read_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        if exc is not None:
            self._error = exc
        self._wake()
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc or ConnectionResetError("connection lost"))
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- streams ------------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, timeout_s: float | None) -> None:
        """Wait for bytes, the end or a failure; ``TimeoutError`` after ``timeout_s``."""
        if self._error is not None:
            raise self._error
        if self._read_paused and self._transport is not None:
            self._read_paused = False
            self._transport.resume_reading()
        self._waiter = self._loop.create_future()
        try:
            if timeout_s is None:
                await self._waiter
            else:
                async with asyncio.timeout(timeout_s):
                    await self._waiter
        finally:
            self._waiter = None

    def _take(self, size: int) -> bytes:
        data = bytes(self._scratch[self._start : self._start + size])
        self._start += size
        if self._start == self._end:
            self._start = self._end = 0
        return data

    async def readuntil(self, separator: bytes, limit: int, timeout_s: float | None) -> bytes:
        """The bytes up to and including ``separator``.

        Raises:
            TimeoutError: No byte came for ``timeout_s`` seconds.
            asyncio.LimitOverrunError: ``limit`` bytes came without the separator.
            asyncio.IncompleteReadError: The connection ended first.
            OSError: The connection failed.
        """
        searched = self._start
        while True:
            found = self._scratch.find(separator, searched, self._end)
            if found >= 0:
                return self._take(found + len(separator) - self._start)
            if self._end - self._start > limit:
                raise asyncio.LimitOverrunError("separator not found within the limit", limit)
            searched = max(self._start, self._end - len(separator) + 1)
            if self._eof:
                if self._error is not None:
                    raise self._error
                raise asyncio.IncompleteReadError(self._take(self._end - self._start), None)
            await self._wait(timeout_s)

    async def readexactly(
        self, size: int, timeout_s: float | None
    ) -> bytes | bytearray | memoryview:
        """Exactly ``size`` bytes: a long run is the buffer the socket read into, not
        copied again (a sampled batch is MiBs): a buffer of the connection's
        :class:`~rlreplay.wire.buffer_pool.BufferPool` when it has one, reused once nobody
        sees it, else a fresh ``bytearray``.

        The reader wakes when the body is complete; while it fills, a timeout that finds
        bytes arrived since the last one waits again, so a body still arriving never times
        out and a stalled one does within twice ``timeout_s``.

        Raises:
            TimeoutError: No byte came for ``timeout_s`` seconds.
            asyncio.IncompleteReadError: The connection ended first.
            OSError: The connection failed.
        """
        unread = self._end - self._start
        if unread >= size:
            return self._take(size)
        body = bytearray(size) if self._buffers is None else self._buffers.take(size)
        body[:unread] = self._scratch[self._start : self._end]
        self._start = self._end = 0
        self._body, self._body_filled = body, unread
        try:
            while self._body_filled < size:
                if self._eof:
                    if self._error is not None:
                        raise self._error
                    partial = bytes(body[: self._body_filled])
                    raise asyncio.IncompleteReadError(partial, size)
                filled = self._body_filled
                try:
                    await self._wait(timeout_s)
                except TimeoutError:
                    if self._body_filled == filled:  # no byte for timeout_s
                        raise
        finally:
            self._body = None
        return body

    async def read(self, size: int, timeout_s: float | None) -> bytes:
        """Up to ``size`` bytes, at least one; ``b""`` at the end of the connection.

        Raises:
            TimeoutError: No byte came for ``timeout_s`` seconds.
        """
        while self._start == self._end:
            if self._eof:
                if self._error is not None:
                    raise self._error
                return b""
            await self._wait(timeout_s)
        return self._take(min(size, self._end - self._start))

    def write(self, data: bytes | memoryview) -> None:
        """Queue ``data`` for sending.

        Raises:
            ConnectionResetError: The connection is closed or closing.
        """
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("the connection is closed")
        self._transport.write(data)

    async def drain(self) -> None:
        """Wait until the transport's write buffer is below its high-water mark."""
        if self._error is not None:
            raise self._error
        if not self._write_paused:
            return
        self._drain_waiter = self._loop.create_future()
        try:
            await self._drain_waiter
        finally:
            self._drain_waiter = None

    def is_stale(self, now: float, expiry: float) -> bool:
        """Whether a pooled connection must not be reused: closed, errored, sent bytes
        unasked, or idle for longer than ``expiry`` seconds."""
        return (
            self._eof
            or self._error is not None
            or self._transport is None
            or self._transport.is_closing()
            or self._end != self._start
            or now - self.idle_since > expiry
        )

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def wait_closed(self) -> None:
        await self._closed
