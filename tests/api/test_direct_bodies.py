"""Long request bodies read straight into one buffer (:mod:`rlreplay.app.api.direct_bodies`):
the app gets every byte, in one message, as a view of that buffer; the connection goes on
with the requests behind it; a client gone or an early answer leave nothing behind.

The protocol tests drive the httptools protocol on the harness of ``test_connections``; the
transport's reads into a buffered protocol are played as asyncio plays them (``get_buffer``
then ``buffer_updated``). The live test pushes MiBs through a real server over TCP and the
Unix socket and reads them back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.app.api.direct_bodies import DIRECT_BODY_BYTES, BodyReader
from rlreplay.clients import ReplayClient
from tests.api.test_connections import HOLDING, FakeTransport, Harness, answered, settle
from tests.live import running_server

DIRECT = dataclasses.replace(HOLDING, max_direct_body_bytes=8 << 20)
SIZE = DIRECT_BODY_BYTES + 12_345


def head(size: int, path: bytes = b"/big") -> bytes:
    return b"POST %b HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % (path, size)


def body_of(size: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def feed(transport: FakeTransport, data: bytes, step: int = 100_000) -> None:
    """``data`` arriving in reads of ``step`` bytes at most, to whichever protocol the
    transport has (a buffered one is given no more than its buffer holds)."""
    at = 0
    while at < len(data):
        protocol = transport.protocol
        if isinstance(protocol, BodyReader):
            buf = protocol.get_buffer(-1)
            n = min(len(buf), step, len(data) - at)
            buf[:n] = data[at : at + n]
            at += n
            protocol.buffer_updated(n)
        else:
            protocol.data_received(data[at : at + step])
            at += step


class Keeping(Harness):
    """The harness's app, keeping the body messages as they came (views and all)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept: list[Any] = []

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        original = receive

        async def keeping() -> Any:
            message = await original()
            if message["type"] == "http.request":
                self.kept.append(message["body"])
            return message

        await super().app(scope, keeping, send)


async def test_a_long_body_reaches_the_app_as_one_view_of_its_buffer() -> None:
    h = Keeping("httptools", DIRECT)
    protocol, transport = h.connect()
    data = body_of(SIZE)
    feed(transport, head(SIZE) + data, step=70_000)  # the head's read brings some body too
    await settle()
    assert answered(transport)
    assert h.bodies == [data] and h.messages == [(SIZE, False)]
    assert isinstance(h.kept[0], memoryview)  # handed over as read: not copied into bytes
    assert transport.protocol is protocol  # the connection's protocol has it back
    # the next request on the connection: a fresh parser reads it
    feed(transport, b"POST /small HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
    await settle()
    assert answered(transport, 2) and h.bodies[-1] == b"abc"


async def test_a_long_bodys_request_is_freed_without_the_garbage_collector() -> None:
    # a request that left a reference cycle behind would wait for a collection, and a
    # collection of thousands of them holds the event loop for tens of milliseconds
    h = Harness("httptools", DIRECT)
    protocol, transport = h.connect()
    gc.disable()
    try:
        feed(transport, head(SIZE) + body_of(SIZE))
        await settle()
        first = weakref.ref(protocol.cycle)
        feed(transport, b"POST /small HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
        await settle()
        assert answered(transport, 2) and protocol.cycle is not first()
        assert first() is None
    finally:
        gc.enable()


async def test_requests_behind_a_long_body_are_answered_in_order() -> None:
    h = Harness("httptools", DIRECT)
    _protocol, transport = h.connect()
    first, second = body_of(SIZE, 1), body_of(SIZE + 1, 2)
    small = b"POST /c HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok"
    feed(transport, head(SIZE) + first + head(SIZE + 1, b"/b") + second + small, step=300_000)
    for _ in range(5):
        await settle()
    assert answered(transport, 3)
    assert h.paths == ["/big", "/b", "/c"] and h.bodies == [first, second, b"ok"]


async def test_a_long_body_in_the_heads_read_is_taken_whole() -> None:
    h = Harness("httptools", DIRECT)
    protocol, transport = h.connect()
    data = body_of(SIZE, 3)
    then = b"POST /next HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx"
    protocol.data_received(head(SIZE) + data + then)  # one read: the parser sees it all
    for _ in range(3):
        await settle()
    assert answered(transport, 2) and h.bodies == [data, b"x"]


async def test_a_client_gone_mid_body_is_a_disconnect() -> None:
    h = Harness("httptools", DIRECT)
    protocol, transport = h.connect()
    feed(transport, head(SIZE) + body_of(SIZE)[: SIZE // 2])
    assert isinstance(transport.protocol, BodyReader)
    transport.close()
    await settle()
    assert h.bodies == [None] and protocol._reader is None


class EarlyAnswers(Harness):
    """An app that answers before reading the body (as a refusal does)."""

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        headers = [(b"content-length", b"0")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


async def test_the_rest_of_a_long_body_answered_early_is_dropped() -> None:
    h = EarlyAnswers("httptools", DIRECT)
    _protocol, transport = h.connect()
    feed(transport, head(SIZE) + body_of(SIZE)[:1000])
    await settle()
    assert answered(transport)
    feed(transport, body_of(SIZE)[1000:])
    feed(transport, b"GET /after HTTP/1.1\r\nHost: a\r\n\r\n")
    await settle()
    assert answered(transport, 2) and h.paths == ["/big", "/after"] and not transport.closed


async def test_a_body_past_the_limit_takes_the_usual_path() -> None:
    h = Keeping("httptools", dataclasses.replace(DIRECT, max_direct_body_bytes=SIZE - 1))
    _protocol, transport = h.connect()
    data = body_of(SIZE)
    feed(transport, head(SIZE) + data)
    await settle()
    assert answered(transport) and h.bodies == [data] and type(h.kept[0]) is bytes


async def test_a_buffer_the_app_still_holds_is_not_reused() -> None:
    h = Keeping("httptools", DIRECT)
    _protocol, transport = h.connect()
    first, second = body_of(SIZE, 4), body_of(SIZE, 5)
    feed(transport, head(SIZE) + first)
    await settle()
    feed(transport, head(SIZE) + second)
    await settle()
    assert answered(transport, 2)
    kept_first, kept_second = h.kept
    assert bytes(kept_first) == first and bytes(kept_second) == second
    assert kept_first.obj is not kept_second.obj


def test_four_bodies_in_flight_each_get_a_buffer_used_again() -> None:
    # on a thread of its own: the pool is the thread's, and none of other tests' buffers
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, _four_bodies_in_flight()).result()


async def _four_bodies_in_flight() -> None:
    h = Keeping("httptools", DIRECT)
    transports = [h.connect()[1] for _ in range(4)]  # a writer's four pushes in flight
    for i, transport in enumerate(transports):
        feed(transport, head(SIZE) + body_of(SIZE, i))  # each held by the app, all at once
    await settle()
    first = {id(view.obj) for view in h.kept}
    assert len(first) == 4
    h.kept.clear()  # the app lets go of them: the next four reuse the same four buffers
    for i, transport in enumerate(transports):
        feed(transport, head(SIZE) + body_of(SIZE, 10 + i))
    await settle()
    assert all(answered(transport, 2) for transport in transports)
    assert {id(view.obj) for view in h.kept} == first


def test_pushes_of_mibs_round_trip_over_tcp_and_the_unix_socket(tmp_path: Path) -> None:
    sock = tmp_path / "r.sock"
    rng = np.random.default_rng(6)
    with running_server(tmp_path, "--uds", str(sock)) as server:

        async def scenario(url: str, table: str) -> None:
            async with ReplayClient(url, timeout_s=60) as rb:
                await rb.create_table(table)
                for round_ in range(3):  # the server's buffers are reused between them
                    big = rng.integers(0, 256, (4, 1 << 20), dtype=np.uint8)
                    tokens = np.asfortranarray(rng.integers(0, 2**31, (8, 50_000), np.int32))
                    keys = [f"r{round_}-{i}" for i in range(4)]
                    await rb.push_columns(table, keys, {"x": big, "t": tokens[:4]}, wait=True)
                    items = [{"key": f"i{round_}", "value": {"t": tokens[4:]}}]
                    await rb.push(table, items, wait=True)
                    got = await rb.get_many(table, keys, layout="columns")
                    np.testing.assert_array_equal(got.columns["x"], big)
                    np.testing.assert_array_equal(got.columns["t"], tokens[:4])
                    item = await rb.get(table, f"i{round_}")
                    assert item is not None
                    np.testing.assert_array_equal(item["value"]["t"], tokens[4:])

        asyncio.run(scenario(server.url, "tcp"))
        asyncio.run(scenario(f"unix://{sock}", "unix"))


async def test_long_bodies_over_a_real_socket_on_asyncios_loop() -> None:
    h = Keeping("httptools", DIRECT)
    loop = asyncio.get_running_loop()

    def protocol() -> Any:
        return h.config.http_protocol_class(  # type: ignore[call-arg]
            config=h.config, server_state=h.state, app_state={}, _loop=loop
        )

    server = await loop.create_server(protocol, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        first, second = body_of(SIZE, 7), body_of(3 * SIZE, 8)
        small = b"POST /c HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok"
        for data in (head(SIZE) + first, head(3 * SIZE, b"/b") + second + small):
            for at in range(0, len(data), 50_000):  # in pieces, as a slow client sends
                writer.write(data[at : at + 50_000])
                await writer.drain()
        answers = b""
        while answers.count(b"HTTP/1.1 200 OK") < 3:
            answers += await asyncio.wait_for(reader.read(65536), 30)
        assert h.bodies == [first, second, b"ok"]
        assert [type(body) for body in h.kept] == [memoryview, memoryview, bytes]
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
