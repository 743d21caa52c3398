"""Connection hygiene (:mod:`rlreplay.app.api.connections`): a slow request head or body is cut off,
an idle keep-alive connection closes, a connection past the cap is refused, and ``/healthz``
answers throughout.

The protocol tests drive uvicorn's protocols (both parsers) on a clock the test moves: no
sleeps, exact deadlines. The live tests attack a real ``rlreplay serve`` with sockets on
127.0.0.1 and wait for each outcome with a generous deadline, never asserting how fast it
came: CI machines are loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from uvicorn.server import ServerState

from rlreplay.app.api.connections import BODY_HOLD_BYTES, ConnectionLimits, guarded_protocol
from rlreplay.app.cli import uvicorn_options
from rlreplay.app.settings import Settings
from tests.live import LiveServer, running_server

PARSERS = ["httptools", "h11"]
HEAD_S = 1.0
BODY_S = 1.0
#: Bytes a body must bring per window in the protocol tests (1000 B/s over 1 s windows).
WINDOW_BYTES = 1000
LIMITS = ConnectionLimits(
    head_timeout_s=HEAD_S,
    body_timeout_s=BODY_S,
    body_min_bytes_per_s=WINDOW_BYTES / BODY_S,
    max_connections=100,
    body_hold_bytes=65_536,  # uvicorn's high-water mark: its pauses, with both parsers
)
#: The limits with the default hold: bodies of these tests reach the app whole.
HOLDING = dataclasses.replace(LIMITS, body_hold_bytes=BODY_HOLD_BYTES)
PUSH_HEAD = (
    b"POST /v1/tables/default/items HTTP/1.1\r\nHost: a\r\n"
    b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
)


# -- protocol tests on a clock the test moves ------------------------------------------------


class _Timer:
    def __init__(self, when: float, callback: Callable[..., object], args: tuple[Any, ...]):
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """The loop a protocol sees: the test's loop runs the app's tasks, time is the test's."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.now = 1000.0
        self.timers: list[_Timer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> _Timer:
        timer = _Timer(when, callback, args)
        self.timers.append(timer)
        return timer

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> _Timer:
        return self.call_at(self.now + delay, callback, *args)

    def create_task(self, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        return self.loop.create_task(coro, **kwargs)

    def advance(self, seconds: float) -> None:
        """Moves the clock, running the timers that come due on the way, in order."""
        end = self.now + seconds
        while True:
            due = [t for t in self.timers if not t.cancelled and t.when <= end]
            if not due:
                break
            timer = min(due, key=lambda t: t.when)
            self.timers.remove(timer)
            self.now = max(self.now, timer.when)
            timer.callback(*timer.args)
        self.now = end


class FakeTransport:
    """Records what the protocol writes; closing it tells the protocol, as asyncio does."""

    def __init__(self) -> None:
        self.protocol: Any = None
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.protocol.connection_lost(None)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol


class Harness:
    """Connections of one guarded protocol class to :func:`gated_app`."""

    def __init__(self, parser: str, limits: ConnectionLimits = LIMITS, ws: str = "none") -> None:
        self.loop = FakeLoop(asyncio.get_running_loop())
        self.gate = asyncio.Event()
        self.gate.set()
        self.paths: list[str] = []
        self.bodies: list[bytes | None] = []
        #: Each body message the app received: its length and ``more_body``.
        self.messages: list[tuple[int, bool]] = []
        protocol_class = guarded_protocol(limits, parser)  # type: ignore[arg-type]
        self.config = uvicorn.Config(
            self.app,
            http=protocol_class,
            lifespan="off",
            interface="asgi3",
            ws=ws,
            log_config=None,
            timeout_keep_alive=30,
        )
        self.config.load()
        self.state = ServerState()

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        """Waits for the gate, reads the body (None when the client went away), answers
        its length."""
        self.paths.append(scope["path"])
        await self.gate.wait()
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.bodies.append(None)
                return
            body += message.get("body", b"")
            self.messages.append((len(message.get("body", b"")), message.get("more_body", False)))
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        answer = str(len(body)).encode()
        headers = [(b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    def connect(self) -> tuple[Any, FakeTransport]:
        protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.state, app_state={}, _loop=self.loop
        )
        transport = FakeTransport()
        transport.protocol = protocol
        protocol.connection_made(transport)
        return protocol, transport


async def settle() -> None:
    """Lets the app's tasks run until they wait again."""
    for _ in range(20):
        await asyncio.sleep(0)


def answered(transport: FakeTransport, count: int = 1) -> bool:
    return bytes(transport.written).count(b"HTTP/1.1 200 OK") == count


def refusal(transport: FakeTransport) -> tuple[int, dict[bytes, bytes], Any]:
    """The status, headers and decoded JSON body of the only answer on ``transport``."""
    head, _, body = bytes(transport.written).partition(b"\r\n\r\n")
    status_line, *lines = head.split(b"\r\n")
    headers = dict(line.split(b": ", 1) for line in lines)
    assert int(headers[b"content-length"]) == len(body)
    return int(status_line.split()[1]), headers, json.loads(body)


@pytest.mark.parametrize("parser", PARSERS)
async def test_a_silent_connection_is_closed_at_the_head_deadline(parser: str) -> None:
    h = Harness(parser)
    _, transport = h.connect()
    h.loop.advance(HEAD_S - 0.05)
    assert not transport.closed
    h.loop.advance(0.1)
    assert transport.closed and transport.written == b""


@pytest.mark.parametrize("parser", PARSERS)
async def test_a_dribbled_head_is_closed_at_the_head_deadline(parser: str) -> None:
    h = Harness(parser)
    protocol, transport = h.connect()
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ")
    for _ in range(9):  # a byte every 0.1 s does not move the deadline
        h.loop.advance(0.1)
        protocol.data_received(b"a")
    h.loop.advance(0.05)
    assert not transport.closed
    h.loop.advance(0.1)
    assert transport.closed and transport.written == b""
    assert h.bodies == []


@pytest.mark.parametrize("parser", PARSERS)
async def test_keep_alive_requests_get_their_own_head_deadline(parser: str) -> None:
    h = Harness(parser)
    protocol, transport = h.connect()
    h.loop.advance(HEAD_S - 0.1)
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    await settle()
    assert answered(transport)
    h.loop.advance(10 * HEAD_S)  # idle: uvicorn's keep-alive (30 s here) decides
    assert not transport.closed
    protocol.data_received(b"GET / HTTP/1.1\r\n")  # the deadline runs from this byte
    h.loop.advance(HEAD_S - 0.05)
    protocol.data_received(b"Host: a\r\n\r\n")
    await settle()
    assert answered(transport, 2)
    protocol.data_received(b"GET / HTTP/1.1\r\n")
    h.loop.advance(HEAD_S + 0.05)
    assert transport.closed


@pytest.mark.parametrize("parser", PARSERS)
async def test_an_idle_keep_alive_connection_closes_after_the_keep_alive(parser: str) -> None:
    h = Harness(parser)
    protocol, transport = h.connect()
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    await settle()
    assert answered(transport)
    h.loop.advance(29)
    assert not transport.closed
    h.loop.advance(2)
    assert transport.closed


@pytest.mark.parametrize("parser", PARSERS)
async def test_a_body_slower_than_the_pace_is_closed(parser: str) -> None:
    h = Harness(parser)
    protocol, transport = h.connect()
    protocol.data_received(PUSH_HEAD)
    await settle()
    for _ in range(9):  # 450 bytes in the first window: under the 1000 asked
        h.loop.advance(0.1)
        protocol.data_received(b" " * 50)
        await settle()
    h.loop.advance(0.05)
    assert not transport.closed
    h.loop.advance(0.1)
    assert transport.closed
    await settle()
    assert h.bodies == [None]  # the app saw the client go
    assert transport.written == b""


@pytest.mark.parametrize("parser", PARSERS)
async def test_a_body_that_stops_is_closed(parser: str) -> None:
    h = Harness(parser)
    protocol, transport = h.connect()
    protocol.data_received(PUSH_HEAD + b" " * 5000)
    await settle()
    h.loop.advance(BODY_S + 0.05)  # the first window brought 5000 bytes: it stays
    assert not transport.closed
    h.loop.advance(BODY_S)  # the second brought none
    assert transport.closed


@pytest.mark.parametrize("parser", PARSERS)
async def test_a_body_at_a_fair_pace_is_answered(parser: str) -> None:
    h = Harness(parser)
    protocol, transport = h.connect()
    protocol.data_received(PUSH_HEAD)
    for _ in range(50):  # 100 KB over 5 s: 2000 bytes every 0.1 s
        h.loop.advance(0.1)
        protocol.data_received(b" " * 2000)
        await settle()
    assert not transport.closed
    assert answered(transport) and h.bodies == [b" " * 100_000]


@pytest.mark.parametrize("parser", PARSERS)
async def test_a_body_the_app_has_not_taken_yet_does_not_count(parser: str) -> None:
    h = Harness(parser)
    h.gate.clear()
    protocol, transport = h.connect()
    protocol.data_received(PUSH_HEAD + b" " * 70_000)  # past uvicorn's 64 KiB: reading pauses
    await settle()
    assert not transport.reading
    h.loop.advance(20 * BODY_S)
    assert not transport.closed
    h.gate.set()
    await settle()
    protocol.data_received(b" " * 30_000)
    await settle()
    assert answered(transport) and h.bodies == [b" " * 100_000]


@pytest.mark.parametrize("parser", PARSERS)
async def test_waiting_for_100_continue_does_not_count(parser: str) -> None:
    h = Harness(parser)
    h.gate.clear()
    protocol, transport = h.connect()
    protocol.data_received(PUSH_HEAD.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"))
    await settle()
    h.loop.advance(20 * BODY_S)
    assert not transport.closed
    h.gate.set()
    await settle()
    assert transport.written.startswith(b"HTTP/1.1 100 Continue")
    protocol.data_received(b" " * 100_000)
    await settle()
    assert answered(transport) and h.bodies == [b" " * 100_000]


@pytest.mark.parametrize("parser", PARSERS)
async def test_an_app_slower_than_the_deadlines_keeps_its_connection(parser: str) -> None:
    h = Harness(parser)
    protocol, transport = h.connect()
    h.gate.clear()
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    await settle()
    h.loop.advance(20 * max(HEAD_S, BODY_S))
    assert not transport.closed
    h.gate.set()
    await settle()
    assert answered(transport)


@pytest.mark.parametrize("parser", PARSERS)
async def test_a_connection_past_the_cap_is_closed_at_once(parser: str) -> None:
    limits = ConnectionLimits(
        head_timeout_s=HEAD_S, body_timeout_s=BODY_S, body_min_bytes_per_s=0, max_connections=2
    )
    h = Harness(parser, limits)
    (_, first_transport), (_, second_transport) = h.connect(), h.connect()
    _, refused = h.connect()
    assert refused.closed and refused.written == b""
    assert not first_transport.closed and not second_transport.closed
    assert len(h.state.connections) == 2
    first_transport.close()
    protocol, transport = h.connect()  # room again
    assert not transport.closed
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    await settle()
    assert answered(transport)


async def test_a_body_reaches_the_app_whole_once_complete() -> None:
    h = Harness("httptools", HOLDING)
    h.gate.clear()  # the app waits: nothing pauses reading all the same
    protocol, transport = h.connect()
    protocol.data_received(PUSH_HEAD)
    for i in range(10):
        protocol.data_received(bytes([i]) * 10_000)
        await settle()
        assert transport.reading
    h.gate.set()
    await settle()
    assert answered(transport)
    assert h.bodies == [b"".join(bytes([i]) * 10_000 for i in range(10))]
    assert h.messages == [(100_000, False)]  # one piece, not uvicorn's 64 KiB ones


async def test_a_body_past_the_hold_comes_in_pieces_with_reading_paused() -> None:
    h = Harness("httptools", dataclasses.replace(LIMITS, body_hold_bytes=30_000))
    h.gate.clear()
    protocol, transport = h.connect()
    protocol.data_received(PUSH_HEAD)
    sent = bytearray()
    for i in range(10):
        chunk = bytes([i]) * 10_000
        sent += chunk
        protocol.data_received(chunk)
        await settle()
        if not transport.reading:  # past the hold: the app must take the piece first
            assert i == 3 and not h.messages
            h.gate.set()
            await settle()
            assert transport.reading and h.messages == [(40_000, True)]
    await settle()
    assert answered(transport) and h.bodies == [bytes(sent)]
    assert sum(n for n, _ in h.messages) == 100_000 and h.messages[-1][1] is False


async def test_chunked_and_pipelined_bodies_arrive_whole() -> None:
    h = Harness("httptools", HOLDING)
    protocol, transport = h.connect()
    chunked = (
        b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    second = b"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
    protocol.data_received(chunked + second)  # the second waits for the first's answer
    for _ in range(5):
        await settle()
    assert answered(transport, 2) and h.bodies == [b"hello world", b"abc"]
    protocol.data_received(b"POST /c HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
    await settle()
    assert answered(transport, 3) and h.bodies[-1] == b""


class EarlyAnswers(Harness):
    """An app that answers before reading the body (as a refusal does)."""

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        self.bodies.append(None)
        headers = [(b"content-length", b"0")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


async def test_the_rest_of_a_body_answered_early_is_dropped() -> None:
    h = EarlyAnswers("httptools", HOLDING)
    protocol, transport = h.connect()
    protocol.data_received(PUSH_HEAD + b" " * 40_000)
    await settle()
    assert answered(transport)
    protocol.data_received(b" " * 60_000)  # the rest: nobody takes it
    assert protocol._held == 0 and not protocol._chunks
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")  # the connection goes on
    await settle()
    assert answered(transport, 2) and not transport.closed


async def test_a_client_gone_mid_body_is_a_disconnect_and_holds_nothing() -> None:
    h = Harness("httptools", HOLDING)
    protocol, transport = h.connect()
    protocol.data_received(PUSH_HEAD + b" " * 50_000)
    await settle()
    transport.close()
    await settle()
    assert h.bodies == [None]
    assert protocol._held == 0 and not protocol._chunks


# An Upgrade is ignored (RFC 9110 7.8): the request is plain HTTP/1.1, body and all.
UPGRADE = b"Connection: Upgrade\r\nUpgrade: %s\r\n"


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("upgrade", [b"h2c", b"websocket"])
async def test_the_body_of_an_upgrade_request_is_its_body_not_a_request(
    parser: str, upgrade: bytes
) -> None:
    h = Harness(parser)
    protocol, transport = h.connect()
    hidden = b"POST /hidden HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"
    head = b"POST /a HTTP/1.1\r\nHost: a\r\n" + UPGRADE % upgrade
    protocol.data_received(head + b"Content-Length: %d\r\n\r\n" % len(hidden))
    await settle()
    protocol.data_received(hidden)  # the body comes in a later packet
    await settle()
    assert h.paths == ["/a"] and h.bodies == [hidden]
    assert answered(transport) and not transport.closed
    protocol.data_received(b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n")  # the connection goes on
    await settle()
    assert h.paths == ["/a", "/b"] and answered(transport, 2)


@pytest.mark.parametrize("parser", PARSERS)
async def test_requests_pipelined_behind_upgrade_requests_are_answered_in_order(
    parser: str,
) -> None:
    h = Harness(parser)
    protocol, transport = h.connect()
    protocol.data_received(
        b"GET /healthz HTTP/1.1\r\nHost: a\r\n" + UPGRADE % b"websocket" + b"\r\n"
        b"GET /readyz HTTP/1.1\r\nHost: a\r\n\r\n"
        b"POST /c HTTP/1.1\r\nHost: a\r\n" + UPGRADE % b"h2c" + b"Transfer-Encoding: chunked\r\n"
        b"\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        b"GET /d HTTP/1.1\r\nHost: a\r\n\r\n"
    )
    for _ in range(5):
        await settle()
    assert h.paths == ["/healthz", "/readyz", "/c", "/d"]
    assert h.bodies == [b"", b"", b"hello world", b""]
    assert answered(transport, 4) and not transport.closed
    answers = bytes(transport.written).split(b"HTTP/1.1 200 OK")[1:]
    assert [a.rsplit(b"\r\n\r\n", 1)[1] for a in answers] == [b"0", b"0", b"11", b"0"]


@pytest.mark.parametrize("parser", PARSERS)
async def test_many_upgrade_requests_in_one_packet_are_all_answered(parser: str) -> None:
    h = Harness(parser)
    protocol, transport = h.connect()
    requests = [b"GET /%d HTTP/1.1\r\nHost: a\r\n%s\r\n" % (i, UPGRADE % b"h2c") for i in range(50)]
    protocol.data_received(b"".join(requests))
    for _ in range(50):
        await settle()
    assert h.paths == [f"/{i}" for i in range(50)] and answered(transport, 50)


@pytest.mark.parametrize("parser", PARSERS)
async def test_a_websocket_upgrade_still_switches_when_websockets_are_on(parser: str) -> None:
    h = Harness(parser, ws="websockets-sansio")
    protocol, transport = h.connect()
    protocol.data_received(
        b"GET /ws HTTP/1.1\r\nHost: a\r\n"
        + UPGRADE % b"websocket"
        + b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    assert isinstance(transport.protocol, h.config.ws_protocol_class)  # type: ignore[arg-type]
    assert h.paths == [] and transport.written == b""  # uvicorn's websocket protocol answers
    transport.close()
    await settle()


@pytest.mark.parametrize("parser", PARSERS)
async def test_connect_is_refused_with_the_error_body(parser: str) -> None:
    h = Harness(parser)
    protocol, transport = h.connect()
    protocol.data_received(
        b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"
    )
    await settle()
    status, headers, body = refusal(transport)
    assert (status, body["error"]["code"]) == (400, "bad_request")
    assert "CONNECT" in body["error"]["message"]
    assert headers[b"connection"] == b"close" and transport.closed and h.paths == []


NOT_HTTP = {
    "garbage": b"\x00\x01garbage\r\n\r\n",
    "content_length_abc": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n",
    "content_length_negative": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
    "content_length_twice": (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
    ),
    "bad_chunk_size": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "unknown_method": b"FROB / HTTP/1.1\r\nHost: a\r\n\r\n",
}


@pytest.mark.parametrize(
    ("parser", "case"),
    # h11 takes any token for a method: the app answers FROB
    [(p, c) for p in PARSERS for c in NOT_HTTP if (p, c) != ("h11", "unknown_method")],
)
async def test_a_request_the_parser_refuses_gets_the_error_body(parser: str, case: str) -> None:
    h = Harness(parser)
    h.state.default_headers = [(b"date", b"Mon, 01 Jan 2024 00:00:00 GMT")]
    protocol, transport = h.connect()
    protocol.data_received(NOT_HTTP[case])
    await settle()
    status, headers, body = refusal(transport)
    assert (status, body["error"]["code"]) == (400, "bad_request")
    assert body["error"]["message"] == "the request is not valid HTTP/1.1"
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"connection"] == b"close" and headers[b"date"].startswith(b"Mon")
    assert transport.closed


@pytest.mark.parametrize("parser", PARSERS)
async def test_a_head_past_64_kib_is_refused_with_431(parser: str) -> None:
    h = Harness(parser)
    protocol, transport = h.connect()
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: ")
    for _ in range(63):
        protocol.data_received(b"a" * 1024)
    protocol.data_received(b"\r\n\r\n")  # 63 KiB and a bit: answered
    await settle()
    assert answered(transport) and not transport.closed
    transport.written.clear()
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: ")
    for _ in range(63):
        protocol.data_received(b"a" * 1024)
    assert not transport.closed
    protocol.data_received(b"a" * 2048)
    status, headers, body = refusal(transport)
    assert (status, body["error"]["code"]) == (431, "bad_request")
    assert headers[b"connection"] == b"close" and transport.closed


@pytest.mark.parametrize("parser", PARSERS)
async def test_a_head_behind_a_large_body_is_not_counted_with_it(parser: str) -> None:
    h = Harness(parser, HOLDING)
    protocol, transport = h.connect()
    protocol.data_received(PUSH_HEAD + b" " * 100_000 + b"GET /b HTTP/1.1\r\n")
    await settle()
    protocol.data_received(b"Host: a\r\n\r\n")
    for _ in range(5):
        await settle()
    assert answered(transport, 2) and h.paths == ["/v1/tables/default/items", "/b"]


def test_limits_name_the_bad_value() -> None:
    with pytest.raises(ValueError, match=r"head_timeout_s \(0\) must be > 0"):
        ConnectionLimits(
            head_timeout_s=0, body_timeout_s=1, body_min_bytes_per_s=0, max_connections=1
        )
    with pytest.raises(ValueError, match=r"max_connections \(0\) must be > 0"):
        ConnectionLimits(
            head_timeout_s=1, body_timeout_s=1, body_min_bytes_per_s=0, max_connections=0
        )
    with pytest.raises(ValueError, match=r"body_hold_bytes \(0\) must be > 0"):
        dataclasses.replace(LIMITS, body_hold_bytes=0)
    with pytest.raises(ValueError, match=r"max_head_bytes \(0\) must be > 0"):
        dataclasses.replace(LIMITS, max_head_bytes=0)


def test_the_settings_reach_uvicorn(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        request_head_timeout_s=3,
        request_body_timeout_s=4,
        request_body_min_kb_per_s=2,
        keep_alive_s=7,
        max_connections=9,
    )
    options = uvicorn_options(settings)
    assert options["timeout_keep_alive"] == 7
    assert options["http"].limits == ConnectionLimits(
        head_timeout_s=3,
        body_timeout_s=4,
        body_min_bytes_per_s=2048,
        max_connections=9,
        max_direct_body_bytes=int(settings.max_request_mb * 1024 * 1024),
    )
    assert options["http"].limits.body_hold_bytes == BODY_HOLD_BYTES
    # a chunked body past a lower limit is handed over, and refused, as soon as it passes it
    small = uvicorn_options(Settings(data_dir=tmp_path, max_request_mb=1))
    assert small["http"].limits.body_hold_bytes == 1024 * 1024
    defaults = Settings(data_dir=tmp_path)
    assert (defaults.request_head_timeout_s, defaults.keep_alive_s) == (10, 30)
    assert defaults.max_connections == 2048


def test_the_open_file_limit_is_raised_to_fit_max_connections() -> None:
    script = (
        "import resource\n"
        "from rlreplay.app.api.connections import raise_descriptor_limit\n"
        "_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "raise_descriptor_limit(1000)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    soft, hard = (int(n) for n in out.stdout.split())
    wanted = 1000 + 256
    assert soft == (wanted if hard < 0 else min(wanted, hard))
    if hard >= 0 and hard < wanted:
        assert "open-file limit" in out.stderr


# -- live: a real server attacked over 127.0.0.1 ------------------------------------------


def _connect(port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


def _port(server: LiveServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _closed(sock: socket.socket, received: bytearray) -> bool:
    """Whether the server closed ``sock`` (what it sent before is added to ``received``)."""
    try:
        data = sock.recv(65536)
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
    if not data:
        return True
    received += data
    return False


def _wait(condition: Callable[[], bool], seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def _get_healthz(sock: socket.socket) -> bytes:
    """One ``GET /healthz`` on ``sock``, kept alive; the answer's bytes."""
    sock.setblocking(True)
    sock.settimeout(10)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
    answer = b""
    while b'"ok"}' not in answer:
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    sock.setblocking(False)
    return answer


def _log_records(server: LiveServer) -> list[dict[str, Any]]:
    records = []
    for line in server.log().splitlines():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return records


@contextlib.contextmanager
def _sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for sock in opened:
            sock.close()


def test_slow_clients_are_cut_off_while_healthz_answers(tmp_path: Path) -> None:
    flags = ("--storage-mode", "memory", "--request-head-timeout-s", "1")
    flags += ("--request-body-timeout-s", "1")  # and the default pace, 1 KiB/s
    with running_server(tmp_path, *flags) as server, _sockets() as opened:
        port = _port(server)
        silent = [_connect(port) for _ in range(50)]
        heads = [_connect(port) for _ in range(50)]
        bodies = [_connect(port) for _ in range(50)]
        opened += silent + heads + bodies
        for sock in heads:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Slow: ")
        for sock in bodies:
            sock.sendall(PUSH_HEAD)
        received = {sock: bytearray() for sock in opened}
        still_open = set(opened)
        rounds = healthy = 0
        deadline = time.monotonic() + 20
        with httpx.Client(base_url=server.url, timeout=10) as client:
            while still_open and time.monotonic() < deadline:
                for sock in still_open - set(silent):  # a byte each, 5 a second at most
                    with contextlib.suppress(OSError):
                        sock.send(b" ")
                still_open = {s for s in still_open if not _closed(s, received[s])}
                rounds += 1
                healthy += client.get("/healthz").status_code == 200
                time.sleep(0.2)
            pushed = client.post(
                "/v1/tables/default/items", json={"items": [{"key": "k", "value": 1}]}
            )
        assert not still_open, (
            f"{len(still_open & set(silent))} silent, {len(still_open & set(heads))} head and "
            f"{len(still_open & set(bodies))} body sockets still open after 20 s"
        )
        assert healthy == rounds  # /healthz answered 200 all through the attack
        assert pushed.status_code == 202  # and a client that sends its request is served
        assert all(not data for data in received.values())  # cut off, not answered 400
        assert server.process.poll() is None
        # a push cut off in its body is the client's doing: no 500, no traceback
        assert not [r for r in _log_records(server) if r.get("msg") == "unhandled error"]


def test_an_idle_keep_alive_connection_is_closed(tmp_path: Path) -> None:
    flags = ("--storage-mode", "memory", "--keep-alive-s", "1", "--request-head-timeout-s", "60")
    with running_server(tmp_path, *flags) as server, _sockets() as opened:
        sock = _connect(_port(server))
        opened.append(sock)
        assert _get_healthz(sock).startswith(b"HTTP/1.1 200")
        # well before the 60 s head deadline: the keep-alive closed it
        assert _wait(lambda: _closed(sock, bytearray()))


def test_connections_past_the_cap_are_refused_until_others_go(tmp_path: Path) -> None:
    flags = ("--storage-mode", "memory", "--max-connections", "20")
    flags += ("--request-head-timeout-s", "60")
    with running_server(tmp_path, *flags) as server, _sockets() as opened:
        port = _port(server)
        held: list[socket.socket] = []
        for _ in range(200):  # the readiness probes' connections may take a moment to go
            if len(held) == 20:
                break
            sock = _connect(port)
            opened.append(sock)
            try:
                answer = _get_healthz(sock)
            except ConnectionError:
                answer = b""
            if answer.startswith(b"HTTP/1.1 200"):
                held.append(sock)
            else:
                time.sleep(0.1)
        assert len(held) == 20
        extra = _connect(port)
        opened.append(extra)
        extra.send(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        received = bytearray()
        assert _wait(lambda: _closed(extra, received))
        assert received == b""
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.url}/healthz", timeout=10)
        assert _wait(lambda: any(r.get("refused", 0) > 0 for r in _log_records(server)), seconds=20)
        held.pop().close()

        def healthz_answers() -> bool:
            with contextlib.suppress(httpx.TransportError):
                return httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
            return False

        assert _wait(healthz_answers)
        for sock in held:  # the others still work
            assert _get_healthz(sock).startswith(b"HTTP/1.1 200")
