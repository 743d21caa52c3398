"""A lean HTTP/1.1 keep-alive transport for httpx, on an asyncio protocol, ``http://`` only.

httpx's default transport (httpcore on h11 and anyio) spends most of a large answer's client
CPU in per-read machinery: event objects, context managers, sniffio look-ups. For the replay
service's answers (up to a few MiB of msgpack, framed by ``Content-Length``) that bounded how
fast :meth:`~rlreplay.clients.client.ReplayClient.stream` could take batches from a local server.
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

Errors are httpx's, with httpx's meaning, which :mod:`rlreplay.clients.retry` relies on to tell a
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

The parts live in their own modules: :mod:`rlreplay.clients.http11` (the message format),
:mod:`rlreplay.clients.connection` (one TCP connection), :mod:`rlreplay.clients.connection_pool`
(the idle
connections) and :mod:`rlreplay.clients.exchange` (one request and its answer, with httpx's errors).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Final

import httpx

from rlreplay.clients.connection import Connection
from rlreplay.clients.connection_pool import Address, ConnectionPool
from rlreplay.clients.exchange import StaleConnection, read_answer, write_request
from rlreplay.clients.http11 import (
    MAX_HEADER_BYTES,
    Answer,
    has_token,
    request_body,
    request_head,
)
from rlreplay.wire.buffer_pool import BufferPool
from rlreplay.wire.compression import decompress_into, is_zstd
from rlreplay.wire.pieces import Pieces

__all__ = ["LeanTransport"]

_IDEMPOTENT_METHODS: Final = frozenset({b"GET", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"TRACE"})
_DEFAULT_PORT: Final = 80


def _timeouts(request: httpx.Request) -> Mapping[str, float | None]:
    timeouts: Mapping[str, float | None] = request.extensions.get("timeout", {})
    return timeouts


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
        uds: Connect to this Unix domain socket, whatever the URL's host and port (as
            ``httpx.AsyncHTTPTransport(uds=...)`` does).
        receive_buffers: Buffers kept for long answers (256 KiB and more), each reused
            once nothing made from it is left (see :mod:`rlreplay.wire.buffer_pool`): a
            batch read into one stays valid for as long as anybody holds a view of it.
    """

    def __init__(
        self,
        *,
        max_connections: int | None = None,
        max_keepalive_connections: int = 16,
        keepalive_expiry: float = 30.0,
        max_header_bytes: int = MAX_HEADER_BYTES,
        uds: str | None = None,
        receive_buffers: int = 4,
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
        self._buffers = BufferPool(max_buffers=receive_buffers)
        self._pool = ConnectionPool(
            max_idle=max_keepalive_connections,
            expiry=keepalive_expiry,
            uds=uds,
            buffers=self._buffers,
        )
        self._max_header = max_header_bytes

    def receive_buffers(self, count: int) -> AbstractContextManager[None]:
        """Keep up to ``count`` receive buffers while the block runs (see
        :meth:`BufferPool.widened`)."""
        return self._buffers.widened(count)

    def idle_connections(self) -> int:
        """How many idle connections the pool holds, over every ``(host, port)``."""
        return self._pool.idle_connections()

    async def aclose(self) -> None:
        """Close the idle connections; connections in use are closed when their answer ends.

        Calling it again does nothing.
        """
        await self._pool.aclose()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send one request and read its whole answer (see the module docstring)."""
        answer, body = await self._round_trip(request)
        return _response(request, answer, bytes(body))

    async def fetch(
        self, request: httpx.Request
    ) -> tuple[httpx.Response, bytes | bytearray | memoryview]:
        """:meth:`handle_async_request`, the body left as it was read: the answer's status
        and headers as an ``httpx.Response`` without content, and the body, a long one in
        the bytearray the socket read it into. The replay client decodes it from there:
        ``bytes`` of a sampled batch was one more copy of MiBs per answer.
        """
        answer, body = await self._round_trip(request)
        coding = [value for name, value in answer.headers if name.lower() == b"content-encoding"]
        if coding and is_zstd(coding[0]) and len(coding) == 1:  # into a receive buffer
            try:
                body = decompress_into(body, self._buffers.take)
            except ValueError as exc:
                raise httpx.DecodingError(f"the zstd answer cannot be read: {exc}") from exc
            answer.headers = [
                (name, value)
                for name, value in answer.headers
                if name.lower() not in (b"content-encoding", b"content-length")
            ]
        elif coding:
            response = _response(request, answer, bytes(body))  # httpx decodes it (a proxy's)
            return response, response.content
        return _response(request, answer, b""), body

    async def _round_trip(
        self, request: httpx.Request
    ) -> tuple[Answer, bytes | bytearray | memoryview]:
        if self._pool.closed:
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
        body = await request_body(request)
        head = request_head(request, body)
        close_after = has_token(request.headers.get("Connection", "").encode("latin-1"), b"close")
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
        body: bytes | Pieces,
        close_after: bool,
    ) -> tuple[Answer, bytes | bytearray | memoryview]:
        conn = self._pool.checkout(address)
        if conn is not None:
            try:
                return await self._send(request, conn, address, timeouts, head, body, close_after)
            except StaleConnection as stale:
                safe = request.method.encode("ascii") in _IDEMPOTENT_METHODS or (
                    request.extensions.get("idempotent") is True
                )
                if not safe:
                    raise stale.error from stale.error.__cause__
        conn = await self._pool.connect(address, timeouts.get("connect"))
        try:
            return await self._send(request, conn, address, timeouts, head, body, close_after)
        except StaleConnection as stale:  # pragma: no cover - a fresh connection is not reused
            raise stale.error from stale.error.__cause__

    async def _send(
        self,
        request: httpx.Request,
        conn: Connection,
        address: Address,
        timeouts: Mapping[str, float | None],
        head: bytes,
        body: bytes | Pieces,
        close_after: bool,
    ) -> tuple[Answer, bytes | bytearray | memoryview]:
        """One request on ``conn``; pools the connection after a clean answer, else closes it."""
        try:
            await write_request(conn, head, body, timeouts.get("write"))
            answer, content = await read_answer(
                request, conn, timeouts.get("read"), self._max_header
            )
        except BaseException:
            conn.close()
            raise
        if answer.keep_alive and not close_after:
            self._pool.checkin(address, conn)
        else:
            conn.close()
        return answer, content


def _response(request: httpx.Request, answer: Answer, content: bytes) -> httpx.Response:
    return httpx.Response(
        answer.status,
        headers=answer.headers,
        content=content,
        request=request,
        extensions={"http_version": answer.version, "reason_phrase": answer.reason},
    )
