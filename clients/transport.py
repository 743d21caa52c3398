"""A lean HTTP/1.1 keep-alive transport for httpx, on an asyncio protocol, ``http://`` only.

httpx's default transport (httpcore on h11 and anyio) spends most of a large answer's client
CPU in per-read machinery: event objects, context managers, sniffio look-ups. For the replay
service's answers (up to a few MiB of msgpack, framed by ``Content-Length``) that bounded how
fast :meth:`~clients.client.ReplayClient.stream` could take batches from a local server.
:class:`LeanTransport` implements the same seam (``httpx.AsyncBaseTransport``) with the few
operations HTTP/1.1 needs: one ``write`` per request, a search for the blank line that ends
the head, and a body received straight into a buffer of its ``Content-Length``.

What it does:

* Plain ``http://`` URLs only (anything else raises ``httpx.UnsupportedProtocol``); no
  proxies, no HTTP/2, no upgrades, no ``Expect: 100-continue``.
* Connections are kept alive and reused last-in first-out, per ``(host, port)``. At most
  ``max_keepalive_connections`` idle ones are kept per ``(host, port)`` (the oldest idle one
  is closed to make room), and an idle one older than ``keepalive_expiry`` is closed rather
  than reused. With ``max_connections`` set, at most that many requests are in flight at
  once; further ones wait for a slot, up to the request's ``pool`` timeout
  (``httpx.PoolTimeout``).
* Bodies framed by ``Content-Length`` or ``Transfer-Encoding: chunked``, or by the end of
  the connection; no body for ``HEAD`` and for 1xx, 204 and 304 answers. Interim 1xx answers
  (``103 Early Hints``) are skipped. The response is returned already read.
* ``Connection: close`` from either side, an HTTP/1.0 answer without ``keep-alive``, or a
  body framed by the end of the connection: the connection is closed after the answer.
* A connection that failed in any way, or whose request was cancelled, is closed, never
  pooled again.

Timeouts come from the request's ``extensions["timeout"]`` (what httpx puts there): ``pool``
bounds the wait for a slot, ``connect`` the TCP connect, ``write`` sending the request, and
``read`` every read (the head, each chunk, each MiB of a body), as httpcore does.

Errors are httpx's, with httpx's meaning, which :mod:`clients.retry` relies on to tell a
request that never left from one that may have reached the server:

* not sent: ``ConnectError`` (refused, unreachable, DNS), ``ConnectTimeout``, ``PoolTimeout``;
* possibly sent: ``WriteError``, ``WriteTimeout``, ``ReadError`` (the connection was reset),
  ``ReadTimeout``, ``RemoteProtocolError`` (the server closed the connection before the end
  of the answer, or answered something that is not HTTP/1.x);
* ``LocalProtocolError``: the request cannot be written (CR or LF in a header).

Stale connections: a server may close a keep-alive connection while it sits idle in the pool
(uvicorn does after 5 s). Before reusing one, the transport drops it if the server's close has
already arrived (end of stream, reset, or the transport is closing), if it holds bytes nobody
asked for (a ``408`` some servers send before closing), or if it has been idle for longer
than ``keepalive_expiry``. A close can still cross the request on the wire; then the
request fails on a *reused* connection before a single byte of the answer arrived (end of
stream, reset or broken pipe while writing or while waiting for the status line). In exactly
that case, and only for a request that is safe to repeat, the transport sends it once more on
a fresh connection. Safe to repeat means an idempotent method (``GET``, ``HEAD``, ``PUT``,
``DELETE``, ``OPTIONS``, ``TRACE``, RFC 9110 section 9.2.2) or a request that carries the
extension ``"idempotent": True`` (the replay client marks its idempotent POSTs so). Other
requests get the error (``RemoteProtocolError`` or ``ReadError``/``WriteError``): their caller
decides, as httpcore would leave it to them too. Failures on a fresh connection, timeouts,
and failures after part of the answer arrived are never retried here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Final

import httpx

__all__ = ["LeanTransport"]

_IDEMPOTENT_METHODS: Final = frozenset({b"GET", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"TRACE"})
_BODYLESS_STATUS: Final = frozenset({204, 304})
_DEFAULT_PORT: Final = 80
_BODY_PIECE: Final = 1 << 20  # a body is read (and timed) a MiB at a time
_MAX_HEADER_BYTES: Final = 64 * 1024
_SCRATCH_BYTES: Final = 64 * 1024
_SCRATCH_PAUSE: Final = _MAX_HEADER_BYTES + _BODY_PIECE  # unread bytes before reads pause
_HTTP11: Final = b"HTTP/1.1"
_HTTP10: Final = b"HTTP/1.0"

Address = tuple[str, int]


class _Connection(asyncio.BufferedProtocol):
    """One TCP connection: a buffered protocol with the few stream operations HTTP needs.

    Bytes arrive in a small scratch buffer (heads, chunk sizes, short bodies). While
    :meth:`readexactly` waits for a long body, the socket reads straight into a buffer of the
    body's size, so a 1 MiB answer is copied once from the kernel and once into ``bytes``
    (asyncio's ``StreamReader`` copies it three times, in 256 KiB steps).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._scratch = bytearray(_SCRATCH_BYTES)
        self._start = 0  # the unread bytes are _scratch[_start:_end]
        self._end = 0
        self._body: bytearray | None = None  # where readexactly() wants the bytes
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
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

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

    async def readexactly(self, size: int, timeout_s: float | None) -> bytes:
        """Exactly ``size`` bytes.

        Raises:
            TimeoutError: No byte came for ``timeout_s`` seconds.
            asyncio.IncompleteReadError: The connection ended first.
            OSError: The connection failed.
        """
        unread = self._end - self._start
        if unread >= size:
            return self._take(size)
        body = bytearray(size)
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
                await self._wait(timeout_s)
        finally:
            self._body = None
        return bytes(body)

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

    def write(self, data: bytes) -> None:
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


class _StaleConnection(Exception):
    """A reused connection failed before any byte of the answer: the request may be resent."""

    def __init__(self, error: httpx.TransportError) -> None:
        super().__init__(str(error))
        self.error = error


class _Answer:
    """The parsed head of an answer."""

    __slots__ = ("headers", "keep_alive", "reason", "status", "version")

    def __init__(
        self,
        status: int,
        reason: bytes,
        version: bytes,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
    ) -> None:
        self.status = status
        self.reason = reason
        self.version = version
        self.headers = headers
        self.keep_alive = keep_alive


def _timeouts(request: httpx.Request) -> Mapping[str, float | None]:
    timeouts: Mapping[str, float | None] = request.extensions.get("timeout", {})
    return timeouts


def _has_token(value: bytes, token: bytes) -> bool:
    return any(part.strip().lower() == token for part in value.split(b","))


def _parse_head(head: bytes) -> _Answer:
    """Parse a status line and headers (``head`` ends with the blank line)."""
    lines = head[:-4].split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (_HTTP11, _HTTP10) or len(code) != 3 or not code.isdigit():
        raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:100]!r}")
    headers: list[tuple[bytes, bytes]] = []
    connection = b""
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or b" " in name:
            raise httpx.RemoteProtocolError(f"malformed header line {line[:100]!r}")
        value = value.strip(b" \t")
        headers.append((name, value))
        if name.lower() == b"connection":
            connection += b"," + value
    if version == _HTTP11:
        keep_alive = not _has_token(connection, b"close")
    else:
        keep_alive = _has_token(connection, b"keep-alive")
    return _Answer(int(code), reason, version, headers, keep_alive)


def _request_head(request: httpx.Request, body: bytes) -> bytes:
    url = request.url
    target = url.raw_path
    method = request.method.encode("ascii")
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in request.headers.raw:
        if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name or b":" in name:
            raise httpx.LocalProtocolError(f"invalid header {name!r}: {value!r}")
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    if b" " in target or b"\r" in target or b"\n" in target or b" " in method:
        raise httpx.LocalProtocolError(f"invalid request line {method!r} {target!r}")
    return b"".join(parts)


async def _request_body(request: httpx.Request) -> bytes:
    try:
        body = request.content
    except httpx.RequestNotRead:
        body = await request.aread()
    if _has_token(request.headers.get("Transfer-Encoding", "").encode("latin-1"), b"chunked"):
        if not body:
            return b"0\r\n\r\n"
        return b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)
    return body


class LeanTransport(httpx.AsyncBaseTransport):
    """An HTTP/1.1 transport with a small keep-alive pool, for plain ``http://`` URLs.

    See the module docstring for what it supports, its errors and its retry of requests that
    met a connection the server had just closed.

    Args:
        max_connections: Requests in flight at most (None: no bound); more wait for a slot
            up to the request's ``pool`` timeout.
        max_keepalive_connections: Idle connections kept per ``(host, port)``.
        keepalive_expiry: Seconds an idle connection may wait in the pool before it is
            closed instead of reused.
        max_header_bytes: The largest status line plus headers accepted.
    """

    def __init__(
        self,
        *,
        max_connections: int | None = None,
        max_keepalive_connections: int = 16,
        keepalive_expiry: float = 30.0,
        max_header_bytes: int = _MAX_HEADER_BYTES,
    ) -> None:
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"max_connections ({max_connections}) must be >= 1 or None")
        if max_keepalive_connections < 0:
            raise ValueError(
                f"max_keepalive_connections ({max_keepalive_connections}) must be >= 0"
            )
        if keepalive_expiry < 0:
            raise ValueError(f"keepalive_expiry ({keepalive_expiry}) must be >= 0")
        if max_header_bytes < 64:
            raise ValueError(f"max_header_bytes ({max_header_bytes}) must be >= 64")
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None
        self._max_idle = max_keepalive_connections
        self._expiry = keepalive_expiry
        self._max_header = max_header_bytes
        self._idle: dict[Address, list[_Connection]] = {}
        self._closed = False

    def idle_connections(self) -> int:
        """How many idle connections the pool holds, over every ``(host, port)``."""
        return sum(len(pool) for pool in self._idle.values())

    async def aclose(self) -> None:
        """Close the idle connections; connections in use are closed when their answer ends.

        Calling it again does nothing.
        """
        self._closed = True
        idle = [conn for pool in self._idle.values() for conn in pool]
        self._idle.clear()
        for conn in idle:
            conn.close()
        for conn in idle:
            try:
                async with asyncio.timeout(1.0):
                    await conn.wait_closed()
            except (OSError, TimeoutError):
                pass

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send one request and read its whole answer (see the module docstring)."""
        if self._closed:
            raise RuntimeError("the transport is closed")
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(
                f"LeanTransport speaks plain http:// only, not {url.scheme!r}://"
            )
        if not url.host:
            raise httpx.UnsupportedProtocol(f"no host in {url!r}")
        address = (url.host, url.port or _DEFAULT_PORT)
        timeouts = _timeouts(request)
        body = await _request_body(request)
        head = _request_head(request, body)
        close_after = _has_token(request.headers.get("Connection", "").encode("latin-1"), b"close")
        if self._slots is None:
            return await self._exchange(request, address, timeouts, head, body, close_after)
        try:
            async with asyncio.timeout(timeouts.get("pool")):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise httpx.PoolTimeout("timed out waiting for a connection slot") from exc
        try:
            return await self._exchange(request, address, timeouts, head, body, close_after)
        finally:
            self._slots.release()

    # --- one exchange -------------------------------------------------------------------

    async def _exchange(
        self,
        request: httpx.Request,
        address: Address,
        timeouts: Mapping[str, float | None],
        head: bytes,
        body: bytes,
        close_after: bool,
    ) -> httpx.Response:
        conn = self._checkout(address)
        if conn is not None:
            try:
                return await self._send(request, conn, address, timeouts, head, body, close_after)
            except _StaleConnection as stale:
                safe = request.method.encode("ascii") in _IDEMPOTENT_METHODS or (
                    request.extensions.get("idempotent") is True
                )
                if not safe:
                    raise stale.error from stale.error.__cause__
        conn = await self._connect(address, timeouts.get("connect"))
        try:
            return await self._send(request, conn, address, timeouts, head, body, close_after)
        except _StaleConnection as stale:  # pragma: no cover - a fresh connection is not reused
            raise stale.error from stale.error.__cause__

    def _checkout(self, address: Address) -> _Connection | None:
        pool = self._idle.get(address)
        if not pool:
            return None
        now = time.monotonic()
        while pool:
            conn = pool.pop()
            if not conn.is_stale(now, self._expiry):
                return conn
            conn.close()
        return None

    def _checkin(self, address: Address, conn: _Connection) -> None:
        if self._closed or self._max_idle == 0:
            conn.close()
            return
        conn.reused = True
        conn.idle_since = time.monotonic()
        pool = self._idle.setdefault(address, [])
        if len(pool) >= self._max_idle:
            pool.pop(0).close()  # the oldest idle one: the likeliest to go stale
        pool.append(conn)

    async def _connect(self, address: Address, timeout_s: float | None) -> _Connection:
        host, port = address
        try:
            async with asyncio.timeout(timeout_s):
                loop = asyncio.get_running_loop()
                _, conn = await loop.create_connection(lambda: _Connection(loop), host, port)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        return conn

    async def _send(
        self,
        request: httpx.Request,
        conn: _Connection,
        address: Address,
        timeouts: Mapping[str, float | None],
        head: bytes,
        body: bytes,
        close_after: bool,
    ) -> httpx.Response:
        """One request on ``conn``; pools the connection after a clean answer, else closes it."""
        try:
            await self._write(conn, head + body if body else head, timeouts.get("write"))
            answer, content = await self._read_answer(request, conn, timeouts.get("read"))
        except BaseException:
            conn.close()
            raise
        if answer.keep_alive and not close_after:
            self._checkin(address, conn)
        else:
            conn.close()
        return httpx.Response(
            answer.status,
            headers=answer.headers,
            content=content,
            request=request,
            extensions={"http_version": answer.version, "reason_phrase": answer.reason},
        )

    @staticmethod
    async def _write(conn: _Connection, data: bytes, timeout_s: float | None) -> None:
        try:
            conn.write(data)
            async with asyncio.timeout(timeout_s):
                await conn.drain()
        except TimeoutError as exc:
            raise httpx.WriteTimeout("writing the request timed out") from exc
        except OSError as exc:
            error = httpx.WriteError(f"writing the request failed: {exc!r}")
            error.__cause__ = exc
            if conn.reused and isinstance(exc, ConnectionError):
                raise _StaleConnection(error) from exc
            raise error from exc

    async def _read_answer(
        self, request: httpx.Request, conn: _Connection, timeout_s: float | None
    ) -> tuple[_Answer, bytes]:
        first = True
        while True:
            answer = await self._read_head(conn, timeout_s, first=first)
            first = False
            if answer.status < 200 and answer.status != 101:
                continue  # an interim answer (100 Continue, 103 Early Hints)
            break
        if request.method == "HEAD" or answer.status in _BODYLESS_STATUS or answer.status < 200:
            if answer.status == 101:
                answer.keep_alive = False  # upgrades are not supported: drop the connection
            return answer, b""
        length: int | None = None
        chunked = False
        for name, value in answer.headers:
            lowered = name.lower()
            if lowered == b"transfer-encoding":
                chunked = value.split(b",")[-1].strip().lower() == b"chunked"
                if not chunked:
                    length = None
                    answer.keep_alive = False  # framed by the end of the connection
                    break
            elif lowered == b"content-length" and not chunked:
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise httpx.RemoteProtocolError(f"invalid Content-Length {value[:40]!r}")
                length = int(value)
        try:
            if chunked:
                if length is not None:
                    answer.keep_alive = False  # both framings: RFC 9112 6.3, don't reuse
                return answer, await self._read_chunked(conn, timeout_s)
            if length is not None:
                return answer, await conn.readexactly(length, timeout_s)
            answer.keep_alive = False
            return answer, await self._read_to_end(conn, timeout_s)
        except asyncio.IncompleteReadError as exc:
            raise httpx.RemoteProtocolError(
                f"the server closed the connection {len(exc.partial)} bytes into a piece of "
                "the body"
            ) from exc
        except TimeoutError as exc:
            raise httpx.ReadTimeout("reading the answer's body timed out") from exc
        except asyncio.LimitOverrunError as exc:
            raise httpx.RemoteProtocolError("a chunk header is too long") from exc
        except ValueError as exc:  # a malformed chunk size, or the reader's own limit
            raise httpx.RemoteProtocolError(f"malformed chunked body: {exc}") from exc
        except OSError as exc:
            raise httpx.ReadError(f"reading the answer failed: {exc!r}") from exc

    async def _read_head(
        self, conn: _Connection, timeout_s: float | None, *, first: bool
    ) -> _Answer:
        """The status line and headers; a stale reused connection raises _StaleConnection."""
        try:
            head = await conn.readuntil(b"\r\n\r\n", self._max_header, timeout_s)
        except TimeoutError as exc:
            raise httpx.ReadTimeout("waiting for the answer timed out") from exc
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise httpx.RemoteProtocolError(
                    "the server closed the connection in the middle of the answer's head"
                ) from exc
            error: httpx.TransportError = httpx.RemoteProtocolError(
                "the server closed the connection without sending an answer"
            )
            error.__cause__ = exc
            if first and conn.reused:
                raise _StaleConnection(error) from exc
            raise error from exc
        except asyncio.LimitOverrunError as exc:
            raise httpx.RemoteProtocolError(
                f"the answer's head is longer than {self._max_header} bytes"
            ) from exc
        except OSError as exc:
            error = httpx.ReadError(f"reading the answer failed: {exc!r}")
            error.__cause__ = exc
            if first and conn.reused and isinstance(exc, ConnectionError):
                raise _StaleConnection(error) from exc
            raise error from exc
        if len(head) > self._max_header:
            raise httpx.RemoteProtocolError(
                f"the answer's head is longer than {self._max_header} bytes"
            )
        return _parse_head(head)

    async def _read_chunked(self, conn: _Connection, timeout_s: float | None) -> bytes:
        pieces: list[bytes] = []
        while True:
            line = await conn.readuntil(b"\r\n", self._max_header, timeout_s)
            if len(line) > self._max_header:
                raise ValueError("chunk header too long")
            size_text = line[:-2].split(b";", 1)[0].strip()
            if not size_text or any(c not in b"0123456789abcdefABCDEF" for c in size_text):
                raise ValueError(f"invalid chunk size {size_text[:40]!r}")
            size = int(size_text, 16)
            if size == 0:
                break
            data = await conn.readexactly(size + 2, timeout_s)
            if data[-2:] != b"\r\n":
                raise ValueError("a chunk does not end with CRLF")
            pieces.append(data[:-2])
        trailer_bytes = 0
        while True:  # trailers, up to the blank line
            line = await conn.readuntil(b"\r\n", self._max_header, timeout_s)
            if line == b"\r\n":
                break
            trailer_bytes += len(line)
            if trailer_bytes > self._max_header:
                raise ValueError("trailers too long")
        return b"".join(pieces)

    @staticmethod
    async def _read_to_end(conn: _Connection, timeout_s: float | None) -> bytes:
        pieces: list[bytes] = []
        while True:
            data = await conn.read(_BODY_PIECE, timeout_s)
            if not data:
                return b"".join(pieces)
            pieces.append(data)
