"""Connection hygiene: deadlines for a slow request head or body, and a cap on connections.

uvicorn closes a keep-alive connection that stays idle after an answer, and nothing else: a
socket that connects and never sends a byte, sends its request head a byte at a time, or
stalls half-way through the body it announced keeps its descriptor and its protocol object
for as long as the peer likes. A few hundred of them use up the process's descriptors and
nobody else can connect. uvicorn's ``limit_concurrency`` does not help: it answers 503 to a
request once its head is complete, so it never sees a socket that does not finish one, and
it accepts the connection all the same.

:func:`guarded_protocol` returns uvicorn's HTTP protocol (httptools, or h11) with the
contract's rules added:

* A connection accepted while ``max_connections`` are open is closed at once, before a
  byte is read or written: the client sees its connection closed without an answer.
* A request head must be complete within ``head_timeout_s`` of the connection being
  accepted (its first request) or of the head's first byte (a later request on a
  keep-alive connection; the idle time before that byte is uvicorn's keep-alive timeout).
* A request body must keep arriving: each window of ``body_timeout_s`` seconds from the end
  of the head must bring at least ``body_min_bytes_per_s * body_timeout_s`` bytes (and at
  least one). A window in which the server held things up (reading paused because the app
  has not taken the body buffered so far, or a ``100 Continue`` not yet sent) does not
  count against the client.

A connection that misses its deadline is closed; a request cut off in its body sees
``http.disconnect``, as if the client had gone away.

The service never switches protocols (uvicorn runs with websockets off), so it ignores an
``Upgrade`` header as RFC 9110 allows: such a request (``curl --http2`` sends ``Upgrade:
h2c``) is answered as HTTP/1.1, its body framed by its ``Content-Length`` or chunks, and the
requests pipelined behind it answered in order. llhttp stops at an upgrade's head, so the
httptools protocol parses the head again without its ``Upgrade`` header, with what follows;
h11 refuses the switch itself when the answer is not a ``101``. ``CONNECT`` is refused.

A request the parser refuses (not HTTP/1.1, a bad ``Content-Length``, a ``CONNECT``) is
answered 400, and one whose head is still incomplete past ``max_head_bytes`` 431, with the
contract's error body (code ``bad_request``), and the connection is closed.

With httptools, a request body also reaches the app in one piece: the connection gathers
its chunks (up to ``body_hold_bytes``) and hands them over, joined, when the body is
complete. uvicorn hands over every 64 KiB instead: each piece copied twice, a wake-up of
the app, and a pause and resume of reading, which cost a push of 64 x 4 KiB more than its
parse. A body past ``body_hold_bytes`` is handed over in pieces of that size, reading
paused until the app takes each. A body of a known length from 256 KiB is read by the
kernel straight into one buffer (:mod:`rlreplay.app.api.direct_bodies`).

The cost on the hot path is a byte count, a clock read and a few attribute writes per
request, in three parser callbacks: each connection has one timer, armed when it is accepted
and re-armed only when it fires, at most every ``min(head_timeout_s, body_timeout_s)``
seconds while the connection lives, never per request or per chunk. Closed connections are
summed up in one warning every 10 s at most (logger ``rlreplay.connections``), so an attack
of thousands of sockets is a few log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import resource
from collections import Counter
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar, Literal, cast

import h11
import httptools
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from rlreplay.app.api.direct_bodies import BodyReader, direct_reader
from rlreplay.app.api.gathered_writes import GATHERED_WRITES, GatheringTransport
from rlreplay.app.api.unix_socket import widen_send_buffer

__all__ = ["BODY_HOLD_BYTES", "ConnectionLimits", "guarded_protocol", "raise_descriptor_limit"]

_log = logging.getLogger("rlreplay.connections")

#: A deadline this close counts as passed (timers may fire a little early, uvloop's in ms).
_SLACK_S = 0.005
#: Closed connections are summed up in one log line at most this often.
_LOG_EVERY_S = 10.0
#: Descriptors kept for everything but client connections (RocksDB, the log, listeners).
_DESCRIPTOR_HEADROOM = 256

# What the connection waits for from its client.
_HEAD = 0  # a request head (since the connection or the head's first byte)
_BODY = 1  # the rest of a request body
_IDLE = 2  # nothing: between requests, or the whole request is in

#: The default of :attr:`ConnectionLimits.body_hold_bytes`: a push of a few MiB, whole.
BODY_HOLD_BYTES = 8 << 20


def _error_body(message: str) -> bytes:
    """The contract's error body (``wire.errors`` is out of this layer's reach)."""
    return json.dumps({"error": {"code": "bad_request", "message": message}}).encode()


_NOT_HTTP = _error_body("the request is not valid HTTP/1.1")
_CONNECT = _error_body("CONNECT is not supported")
_HEAD_TOO_LARGE = _error_body("the request head is too large")


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The deadlines and the cap that :func:`guarded_protocol` enforces."""

    #: Seconds a request head may take.
    head_timeout_s: float
    #: Length of the windows in which a request body must keep arriving.
    body_timeout_s: float
    #: The slowest pace a body may keep up over a window (0: one byte per window will do).
    body_min_bytes_per_s: float
    #: Open connections past which a new one is closed at once.
    max_connections: int
    #: Bytes of a request body a connection gathers before the app gets them (httptools).
    body_hold_bytes: int = BODY_HOLD_BYTES
    #: Bytes past which a request head still incomplete is refused with 431.
    max_head_bytes: int = 64 << 10
    #: The longest body read straight into a buffer of its ``Content-Length`` (httptools;
    #: see :mod:`rlreplay.app.api.direct_bodies`); 0: none. The server's is its request limit.
    max_direct_body_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("head_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} ({value}) must be > 0 and finite")
        if not (self.body_min_bytes_per_s >= 0 and math.isfinite(self.body_min_bytes_per_s)):
            raise ValueError(f"body_min_bytes_per_s ({self.body_min_bytes_per_s}) must be >= 0")
        if self.max_connections <= 0:
            raise ValueError(f"max_connections ({self.max_connections}) must be > 0")
        if self.body_hold_bytes <= 0:
            raise ValueError(f"body_hold_bytes ({self.body_hold_bytes}) must be > 0")
        if self.max_head_bytes <= 0:
            raise ValueError(f"max_head_bytes ({self.max_head_bytes}) must be > 0")
        if self.max_direct_body_bytes < 0:
            raise ValueError(f"max_direct_body_bytes ({self.max_direct_body_bytes}) must be >= 0")

    @property
    def check_every_s(self) -> float:
        """The longest a connection's timer sleeps: no deadline can be closer than this."""
        return min(self.head_timeout_s, self.body_timeout_s)

    @property
    def body_window_bytes(self) -> int:
        """Bytes a body must bring in each window to stay open."""
        return max(1, int(self.body_min_bytes_per_s * self.body_timeout_s))


class _Closures:
    """Counts the connections closed by the rules and logs them in one line every 10 s at
    most (the first at once, the rest when their 10 s are up)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.counts: Counter[str] = Counter()
        self.logged_at = -math.inf
        self.flush_timer: asyncio.TimerHandle | None = None

    def add(self, reason: str, loop: asyncio.AbstractEventLoop) -> None:
        self.counts[reason] += 1
        if self.flush_timer is not None:
            return
        if loop.time() - self.logged_at >= _LOG_EVERY_S:
            self.flush(loop)
        else:
            self.flush_timer = loop.call_at(self.logged_at + _LOG_EVERY_S, self.flush, loop)

    def flush(self, loop: asyncio.AbstractEventLoop) -> None:
        self.flush_timer = None
        _log.warning(
            "connections closed",
            extra={
                "head_timeout": self.counts["head_timeout"],
                "body_timeout": self.counts["body_timeout"],
                "refused": self.counts["refused"],
                "max_connections": self.limits.max_connections,
            },
        )
        self.counts.clear()
        self.logged_at = loop.time()


class _Guard:
    """The rules, shared by both parsers; a subclass moves ``_phase`` as its parser goes.

    Attributes of uvicorn's protocols it uses: ``loop``, ``transport``, ``flow``, ``cycle``,
    ``connections`` and ``server_state``.
    """

    limits: ClassVar[ConnectionLimits]
    closures: ClassVar[_Closures]

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    flow: FlowControl
    cycle: Any
    connections: set[Any]
    server_state: ServerState

    _phase = _HEAD
    #: When the head began, or when the body's current window began.
    _since = 0.0
    #: Bytes received on the connection, and their count when the body's window began.
    _received = 0
    _window_mark = 0
    _timer: asyncio.TimerHandle | None = None

    def _refuse_or_start(self, transport: asyncio.Transport) -> bool:
        """At ``connection_made``: closes the connection past the cap, or starts its timer
        (and widens a Unix socket's send buffer); returns whether the connection goes on."""
        now = self.loop.time()
        if len(self.connections) >= self.limits.max_connections:
            self.transport = transport  # uvicorn's connection_lost uses it
            transport.close()
            self.closures.add("refused", self.loop)
            return False
        self._since = now
        self._timer = self.loop.call_at(now + self.limits.check_every_s, self._check)
        widen_send_buffer(transport)
        return True

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_started(self) -> None:
        if self._phase == _IDLE:
            self._phase = _HEAD
            self._since = self.loop.time()

    def _body_started(self) -> None:
        self._phase = _BODY
        self._since = self.loop.time()
        self._window_mark = self._received

    def _server_holds_up(self) -> bool:
        """Whether the client is waiting for the server rather than the other way round."""
        if self.flow.read_paused:
            return True
        cycle = self.cycle
        return cycle is not None and cycle.waiting_for_100_continue and not cycle.response_complete

    def _check(self) -> None:
        """The timer: closes a connection past its deadline, or sleeps until the next one."""
        self._timer = None
        if self.transport.is_closing():
            return
        limits = self.limits
        now = self.loop.time()
        phase = self._phase
        if phase == _HEAD:
            if self._server_holds_up():
                self._since = now
            due = self._since + limits.head_timeout_s
            if now + _SLACK_S >= due:
                self._close("head_timeout")
                return
        elif phase == _BODY:
            due = self._since + limits.body_timeout_s
            if now + _SLACK_S >= due:
                brought = self._received - self._window_mark
                if brought < limits.body_window_bytes and not self._server_holds_up():
                    self._close("body_timeout")
                    return
                self._since = now
                self._window_mark = self._received
                due = now + limits.body_timeout_s
        else:
            due = now + limits.check_every_s
        self._timer = self.loop.call_at(min(due, now + limits.check_every_s), self._check)

    def _close(self, reason: str) -> None:
        self.closures.add(reason, self.loop)
        self.transport.close()

    def _refuse(self, status: int, body: bytes) -> None:
        """Answers ``status`` with the error ``body`` and closes the connection."""
        if self.transport.is_closing():
            return
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())]
        lines += [
            name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers
        ]
        lines.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
        lines.append(b"connection: close\r\n\r\n")
        self.transport.write(b"".join(lines) + body)
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request its parser refuses, with the contract's body."""
        self._refuse(400, _NOT_HTTP)

    def _unsupported_upgrade_warning(self) -> None:
        """Nothing: an ``Upgrade`` the server ignores is no fault (every ``curl --http2``)."""

    # Both protocols: the guard comes first in their bases, so super() is uvicorn's protocol.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._refuse_or_start(cast(asyncio.Transport, transport)):
            super().connection_made(transport)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)  # type: ignore[misc]


class GuardedHttpToolsProtocol(_Guard, HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadlines and the cap of
    :mod:`rlreplay.app.api.connections`."""

    # The hooks below run for every request: they call the base class directly (cheaper
    # than super()) and inline the phase changes.

    #: The head of an upgrade just declined, re-written without its ``Upgrade`` headers
    #: (``b""``: a ``CONNECT``, refused), for ``data_received`` to parse again.
    _declined: bytes | None = None
    #: The byte count at the end of the chunk being parsed, and where the count of the head
    #: being parsed starts: the end of the chunk in which the last request ended (so a head
    #: behind others in its chunk may pass ``max_head_bytes`` by part of a chunk).
    _chunk_end = 0
    _head_mark = 0

    def data_received(self, data: bytes) -> None:
        """uvicorn's ``data_received``, but an upgrade the server does not honour is parsed
        again as a plain request, and a head still incomplete past ``max_head_bytes`` is
        refused."""
        received = self._chunk_end = self._received + len(data)
        self._unset_keepalive_if_required()
        rest: bytes | memoryview = data
        while True:
            try:
                self.parser.feed_data(rest)
                break
            except httptools.HttpParserError:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("")
                return
            except httptools.HttpParserUpgrade as exc:
                head, self._declined = self._declined, None
                if head is None:  # a websocket upgrade, when uvicorn has websockets on
                    if self._should_upgrade():
                        self.handle_websocket_upgrade()
                    return
                if not head:
                    self._refuse(400, _CONNECT)
                    return
                self.parser = self._fresh_parser()
                try:
                    self.parser.feed_data(head)
                except (httptools.HttpParserError, httptools.HttpParserUpgrade):
                    self._refuse(400, _NOT_HTTP)  # still an upgrade: no loop
                    return
                # llhttp stopped past the head: the body and what follows, not copied
                rest = memoryview(rest)[exc.args[0] :]
        self._received = received  # after: a body's first window counts the head's chunk
        if self._reader is not None and not self.transport.is_closing():
            self.transport.set_protocol(self._reader)  # the rest of the body, straight in
        if self._phase == _HEAD and received - self._head_mark > self.limits.max_head_bytes:
            self.logger.warning("Invalid HTTP request received.")
            self._refuse(431, _HEAD_TOO_LARGE)

    def _fresh_parser(self) -> httptools.HttpRequestParser:
        parser = httptools.HttpRequestParser(self)
        with contextlib.suppress(AttributeError):  # httptools < 0.6.3, as uvicorn does
            parser.set_dangerous_leniencies(lenient_data_after_close=True)
        return parser

    def _without_upgrade(self) -> bytes:
        """The head just parsed, without its ``Upgrade`` headers (``b""`` for a CONNECT,
        which llhttp takes for a tunnel whatever its headers)."""
        method = self.parser.get_method()
        if method == b"CONNECT":
            return b""
        version = self.parser.get_http_version().encode()
        lines = [method + b" " + self.url + b" HTTP/" + version + b"\r\n"]
        lines += [
            name + b": " + value + b"\r\n" for name, value in self.headers if name != b"upgrade"
        ]
        lines.append(b"\r\n")
        return b"".join(lines)

    def on_message_begin(self) -> None:
        if self._phase == _IDLE:
            self._phase = _HEAD
            self._since = self.loop.time()
        HttpToolsProtocol.on_message_begin(self)

    #: The body's chunks not handed to the app yet, and their bytes.
    _chunks: list[bytes]
    _held = 0

    def on_headers_complete(self) -> None:
        if self.parser.should_upgrade() and not self._should_upgrade():
            # no cycle: llhttp skips the body of an upgrade, so the head is parsed again
            self._declined = self._without_upgrade()
            return
        self._phase = _BODY
        self._since = self.loop.time()
        self._window_mark = self._received
        self._chunks = []
        self._held = 0
        scope = self.scope
        scope[GATHERED_WRITES] = True  # type: ignore[typeddict-unknown-key]
        HttpToolsProtocol.on_headers_complete(self)
        cycle = self.cycle
        if cycle is not None and cycle.scope is scope:  # not a websocket's upgrade
            cycle.transport = self._gathering
            self._reader = direct_reader(self, cycle, self.limits.max_direct_body_bytes)

    def on_body(self, body: bytes) -> None:
        """uvicorn's ``on_body``, but the chunks wait here until the body is complete or
        passes ``body_hold_bytes``."""
        if self.parser.should_upgrade() and self._should_upgrade():
            return  # as uvicorn: an upgrade's body is not the app's (and it may have no cycle)
        cycle = self.cycle
        if cycle.response_complete:  # answered already: the rest of the body is dropped
            return
        if self._reader is not None:
            self._reader.take(body)
            return
        self._chunks.append(body)
        self._held += len(body)
        if self._held > self.limits.body_hold_bytes:
            self._hand_over(cycle)
            self.flow.pause_reading()  # the app's next receive() resumes it
            cycle.message_event.set()

    def on_message_complete(self) -> None:
        if self._declined is not None:
            return  # a declined upgrade's, without a body: its head is parsed again
        self._phase = _IDLE
        self._head_mark = self._chunk_end
        reader, self._reader = self._reader, None
        if reader is not None:
            self.cycle.body = reader.body
        elif self._held and not self.cycle.response_complete:
            self._hand_over(self.cycle)
        self._chunks = []
        self._held = 0
        HttpToolsProtocol.on_message_complete(self)

    #: The transport the request cycles write to (see :mod:`rlreplay.app.api.gathered_writes`).
    _gathering: GatheringTransport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._gathering = GatheringTransport(cast(asyncio.Transport, transport))
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._chunks, self._held, self._reader = [], 0, None  # a body cut off: nobody takes it
        super().connection_lost(exc)

    #: The reader of the body in progress, when it goes straight into a buffer.
    _reader: BodyReader | None = None

    def direct_body_read(self, nbytes: int) -> None:
        """The reader took ``nbytes`` more of the body (counted for the body's deadline)."""
        self._received += nbytes
        self._chunk_end = self._received

    def direct_body_done(self) -> None:
        """The body is whole: the transport and a fresh parser take the next request."""
        self.transport.set_protocol(self)
        self.parser = self._fresh_parser()
        self.on_message_complete()

    def _hand_over(self, cycle: Any) -> None:
        """Moves the chunks held to the cycle's body, which the app's receive() takes."""
        chunks = self._chunks
        joined = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        # a body uvicorn's receive() returns as it is (bytes(x) of a bytes is x): no copy
        cycle.body = bytes(cycle.body) + joined if cycle.body else joined
        self._chunks = []
        self._held = 0


class _H11Connection(h11.Connection):
    """h11's connection, keeping the status h11 suggests for the error it raised last (431
    for a head past its bound), which uvicorn drops."""

    error_status = 400

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.error_status = exc.error_status_hint
            raise


class GuardedH11Protocol(_Guard, H11Protocol):
    """uvicorn's h11 protocol with the deadlines and the cap of :mod:`rlreplay.app.api.connections`.

    h11 reports no event for the start of a head, and may take up a buffered request only
    when the previous answer is complete, so the phase follows ``their_state`` after each
    chunk and after each answer.
    """

    conn: _H11Connection

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # h11 bounds an incomplete head itself (16 KiB unless configured): the same as httptools
        bound = self.config.h11_max_incomplete_event_size or self.limits.max_head_bytes
        self.conn = _H11Connection(h11.SERVER, bound)

    def send_400_response(self, msg: str) -> None:
        if self.conn.error_status == 431:
            self._refuse(431, _HEAD_TOO_LARGE)
        else:
            self._refuse(400, _NOT_HTTP)

    def _should_upgrade(self) -> bool:
        # refused as with httptools, where llhttp takes what follows a CONNECT for a tunnel
        return self.scope["method"] == "CONNECT" or H11Protocol._should_upgrade(self)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        if event.method == b"CONNECT":
            self._refuse(400, _CONNECT)
        else:
            H11Protocol.handle_websocket_upgrade(self, event)

    def data_received(self, data: bytes) -> None:
        self._head_started()
        super().data_received(data)
        self._follow()
        self._received += len(data)  # after: a body's first window counts the head's chunk

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def _follow(self) -> None:
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._phase != _BODY:
                self._body_started()
        elif state is h11.IDLE:
            if self._phase == _BODY:  # a new cycle took up a request already in
                self._phase = _IDLE
            if self._phase == _IDLE and self.conn.trailing_data[0]:
                self._head_started()
        else:  # DONE, MUST_CLOSE, CLOSED, ERROR: the client has nothing left to send
            self._phase = _IDLE


def guarded_protocol(
    limits: ConnectionLimits, parser: Literal["httptools", "h11"] = "httptools"
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class enforcing ``limits``, for ``uvicorn.Config(http=...)``.

    Args:
        limits: The deadlines and the cap.
        parser: Which of uvicorn's protocols to extend (``httptools`` is the one
            ``http="auto"`` picks when it is installed, as ``uvicorn[standard]`` does).

    Returns:
        A subclass of the chosen protocol bound to ``limits``.
    """
    base = GuardedHttpToolsProtocol if parser == "httptools" else GuardedH11Protocol
    bound = type(base.__name__, (base,), {"limits": limits, "closures": _Closures(limits)})
    return cast("type[asyncio.Protocol]", bound)


def raise_descriptor_limit(max_connections: int) -> None:
    """Raises the soft limit of open files so that ``max_connections`` fit, when it is lower.

    Below it, accepting a connection would fail before the cap refuses it (many systems
    start processes with a soft limit of 1024). The hard limit is left alone; when it is
    too low, a warning says so.

    Args:
        max_connections: The cap on open connections.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + _DESCRIPTOR_HEADROOM
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < wanted:
        _log.warning(
            "the open-file limit (%d) is below max_connections (%d) + %d: connections may "
            "fail to open before the cap refuses them",
            target,
            max_connections,
            _DESCRIPTOR_HEADROOM,
        )
