"""The sidecar's connection rules: deadlines for a slow request head or body, and a cap on
connections, enforced in uvicorn's HTTP protocol.

uvicorn closes a keep-alive connection that stays idle after an answer, and nothing else: a
socket that connects and never sends a byte, or sends its head or body a byte at a time,
would keep its descriptor for as long as the peer likes. The rules are those of
``rlreplay serve`` (its ``--request-head-timeout-s``, ``--request-body-timeout-s``,
``--request-body-min-kb-per-s`` and ``--max-connections``), for a sidecar that only ever
reads small requests; the server's own protocol is part of its HTTP layer, which the
sidecar may not import:

* A connection accepted while ``max_connections`` are open is closed at once.
* A request head must be complete within ``head_timeout_s`` of the connection being
  accepted (its first request) or of the head's first byte (a later one; the idle time
  before it is uvicorn's keep-alive timeout), and within ``max_head_bytes`` (431).
* A request body must keep arriving: each window of ``body_timeout_s`` must bring at least
  ``body_min_bytes_per_s * body_timeout_s`` bytes (and at least one), except while the
  sidecar holds reading up (a pipelined request waiting for the answer before it).

A request the parser refuses is answered 400 with the contract's error body. Each
connection has one timer, re-armed when it fires, at most every
``min(head_timeout_s, body_timeout_s)`` seconds. Closed connections are counted and summed
up in one warning every 10 s at most (logger ``rlreplay.gpu.connections``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import resource
from collections import Counter
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["SidecarConnectionLimits", "guarded_protocol", "raise_descriptor_limit"]

_log = logging.getLogger("rlreplay.gpu.connections")

_SLACK_S = 0.005  # a deadline this close counts as passed (timers may fire a little early)
_LOG_EVERY_S = 10.0
_DESCRIPTOR_HEADROOM = 64

_HEAD, _BODY, _IDLE = 0, 1, 2  # what the connection waits for from its client


def _error_body(message: str) -> bytes:
    return json.dumps({"error": {"code": "bad_request", "message": message}}).encode()


_NOT_HTTP = _error_body("the request is not valid HTTP/1.1")
_HEAD_TOO_LARGE = _error_body("the request head is too large")


@dataclass(frozen=True, slots=True)
class SidecarConnectionLimits:
    """The deadlines and the cap :func:`guarded_protocol` enforces."""

    #: Seconds a request head may take.
    head_timeout_s: float
    #: Length of the windows in which a request body must keep arriving.
    body_timeout_s: float
    #: The slowest pace a body may keep up over a window (0: one byte per window will do).
    body_min_bytes_per_s: float
    #: Open connections past which a new one is closed at once.
    max_connections: int
    #: Bytes past which a request head still incomplete is refused with 431.
    max_head_bytes: int = 64 << 10

    def __post_init__(self) -> None:
        for name in ("head_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} ({value}) must be > 0 and finite")
        if not (self.body_min_bytes_per_s >= 0 and math.isfinite(self.body_min_bytes_per_s)):
            raise ValueError(f"body_min_bytes_per_s ({self.body_min_bytes_per_s}) must be >= 0")
        if self.max_connections <= 0:
            raise ValueError(f"max_connections ({self.max_connections}) must be > 0")
        if self.max_head_bytes <= 0:
            raise ValueError(f"max_head_bytes ({self.max_head_bytes}) must be > 0")

    @property
    def check_every_s(self) -> float:
        """The longest a connection's timer sleeps."""
        return min(self.head_timeout_s, self.body_timeout_s)

    @property
    def body_window_bytes(self) -> int:
        """Bytes a body must bring in each window to stay open."""
        return max(1, int(self.body_min_bytes_per_s * self.body_timeout_s))


class _Closures:
    """Counts the connections the rules closed; one log line every 10 s at most."""

    def __init__(self, limits: SidecarConnectionLimits) -> None:
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


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the rules of :mod:`rlreplay.gpu.connections`."""

    limits: ClassVar[SidecarConnectionLimits]
    closures: ClassVar[_Closures]

    _phase = _HEAD
    #: When the head began, or when the body's current window began.
    _since = 0.0
    #: Bytes received, their count when the body's window began, and when the head began.
    _received = 0
    _window_mark = 0
    _head_mark = 0
    #: The byte count at the end of the chunk being parsed: a head that follows a request
    #: in its chunk counts from there (so it may pass ``max_head_bytes`` by part of a chunk).
    _chunk_end = 0
    _timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Closes the connection past the cap, or starts its timer."""
        if len(self.connections) >= self.limits.max_connections:
            self.transport = cast(asyncio.Transport, transport)  # connection_lost uses it
            transport.close()
            self.closures.add("refused", self.loop)
            return
        now = self.loop.time()
        self._since = now
        self._timer = self.loop.call_at(now + self.limits.check_every_s, self._check)
        super().connection_made(cast(asyncio.Transport, transport))

    def connection_lost(self, exc: Exception | None) -> None:
        """Stops the timer, then uvicorn's own clean-up."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, then a head still incomplete past ``max_head_bytes`` is refused."""
        received = self._chunk_end = self._received + len(data)
        super().data_received(data)
        self._received = received  # after: a body's first window counts the head's chunk
        if self._phase == _HEAD and received - self._head_mark > self.limits.max_head_bytes:
            self._refuse(431, _HEAD_TOO_LARGE)

    def on_message_begin(self) -> None:
        if self._phase == _IDLE:
            self._phase = _HEAD
            self._since = self.loop.time()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        self._since = self.loop.time()
        self._window_mark = self._received
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        self._head_mark = self._chunk_end
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request its parser refuses, with the contract's body."""
        self._refuse(400, _NOT_HTTP)

    def _refuse(self, status: int, body: bytes) -> None:
        """Answers ``status`` with the error ``body`` and closes the connection."""
        if self.transport.is_closing():
            return
        head = b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())
        head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        self.transport.write(head + b"connection: close\r\n\r\n" + body)
        self.transport.close()

    def _held_up(self) -> bool:
        """Whether the client waits for the sidecar rather than the other way round."""
        return bool(self.flow is not None and self.flow.read_paused)

    def _check(self) -> None:
        """The timer: closes a connection past its deadline, or sleeps until the next one."""
        self._timer = None
        if self.transport is None or self.transport.is_closing():
            return
        limits = self.limits
        now = self.loop.time()
        if self._phase == _HEAD:
            if self._held_up():
                self._since = now
            due = self._since + limits.head_timeout_s
            if now + _SLACK_S >= due:
                self._close("head_timeout")
                return
        elif self._phase == _BODY:
            due = self._since + limits.body_timeout_s
            if now + _SLACK_S >= due:
                brought = self._received - self._window_mark
                if brought < limits.body_window_bytes and not self._held_up():
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


def guarded_protocol(limits: SidecarConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class enforcing ``limits``, for ``uvicorn.run(http=...)``."""
    attributes: dict[str, Any] = {"limits": limits, "closures": _Closures(limits)}
    return cast("type[asyncio.Protocol]", type("GuardedProtocol", (GuardedProtocol,), attributes))


def raise_descriptor_limit(max_connections: int) -> None:
    """Raises the soft limit of open files so that ``max_connections`` fit, when it is lower
    (the hard limit is left alone: a warning says when it is too low)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + _DESCRIPTOR_HEADROOM
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < wanted:
        _log.warning(
            "the open-file limit (%d) is below --max-connections (%d) + %d: connections may "
            "fail to open before the cap refuses them",
            target,
            max_connections,
            _DESCRIPTOR_HEADROOM,
        )
