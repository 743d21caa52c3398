"""LeanTransport against tiny scripted asyncio servers on 127.0.0.1, and against a real server."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvloop

from rlreplay.clients import ReplayClient, Unavailable
from rlreplay.clients.transport import LeanTransport
from rlreplay.wire.codec import packb
from tests.live import free_port, running_server

MAX_REQUESTS_PER_CONNECTION = 100

Reply = Callable[[str, str, asyncio.StreamWriter], Awaitable[bool]]
"""Answers one request (method, path) on a writer; returns False to stop serving it."""


class TinyServer:
    """An HTTP/1.1 server on 127.0.0.1 whose answers a test scripts; counts its connections."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.accepted = 0
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            for _ in range(MAX_REQUESTS_PER_CONNECTION):
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ")
                headers = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (line.partition(":") for line in lines[1:] if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((method, path, headers, body))
                if not await self.reply(method, path, writer):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client left, or the test is over
        finally:
            writer.close()
            self._handlers.discard(task)

    async def __aenter__(self) -> TinyServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()


def answer(body: bytes, *, status: str = "200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status.encode(),
        len(body),
        extra,
        body,
    )


def always(data: bytes) -> Reply:
    async def reply(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        return True

    return reply


@asynccontextmanager
async def lean_client(url: str, **kwargs: object) -> AsyncIterator[httpx.AsyncClient]:
    transport = LeanTransport(**kwargs)  # type: ignore[arg-type]
    async with httpx.AsyncClient(base_url=url, transport=transport, timeout=5.0) as client:
        yield client


async def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - polls state owned by other tasks
            await asyncio.sleep(0.01)


# --- keep-alive -----------------------------------------------------------------------------


async def test_sequential_requests_reuse_one_connection() -> None:
    async with TinyServer(always(answer(b"hello"))) as server, lean_client(server.url) as http:
        for _ in range(5):
            response = await http.get("/x")
            assert response.status_code == 200 and response.content == b"hello"
        assert server.accepted == 1
        assert [r[:2] for r in server.requests] == [("GET", "/x")] * 5


async def test_fetch_hands_a_long_body_over_as_read_and_httpx_gets_bytes() -> None:
    long_body = bytes(range(256)) * 4096  # 1 MiB: read straight into a buffer of its size
    replies = [answer(b"short"), answer(long_body), answer(long_body)]

    async def reply(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        writer.write(replies.pop(0))
        return True

    async with TinyServer(reply) as server:
        transport = LeanTransport()
        try:
            request = httpx.Request("GET", server.url + "/a", extensions={"timeout": {}})
            response, body = await transport.fetch(request)
            assert (response.status_code, body) == (200, b"short")
            assert response.content == b""  # the body is handed over apart
            assert response.headers["content-length"] == "5"
            response, body = await transport.fetch(request)
            # not copied into bytes: a view of a receive buffer
            assert type(body) is memoryview and body == long_body
            response = await transport.handle_async_request(request)
            assert type(response.content) is bytes and response.content == long_body
            assert server.accepted == 1
        finally:
            await transport.aclose()


async def test_request_body_and_headers_reach_the_server() -> None:
    async with TinyServer(always(answer(b"ok"))) as server, lean_client(server.url) as http:
        body = bytes(range(256)) * 1000
        response = await http.post("/p?q=1%2F", content=body, headers={"X-Test": "yes"})
        assert response.content == b"ok"
        method, path, headers, got = server.requests[0]
        assert (method, path, got) == ("POST", "/p?q=1%2F", body)
        assert headers["x-test"] == "yes" and headers["host"] == server.url[len("http://") :]


async def test_concurrent_requests_open_connections_then_reuse_them() -> None:
    async def slow(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.05)
        writer.write(answer(path.encode()))
        return True

    async with TinyServer(slow) as server, lean_client(server.url) as http:
        for _ in range(3):
            responses = await asyncio.gather(*(http.get(f"/{i}") for i in range(4)))
            assert [r.content for r in responses] == [f"/{i}".encode() for i in range(4)]
        assert server.accepted == 4


async def test_max_connections_bounds_connections_and_pool_timeout() -> None:
    async def slow(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.3 if path == "/slow" else 0.02)
        writer.write(answer(b"done"))
        return True

    async with TinyServer(slow) as server, lean_client(server.url, max_connections=2) as http:
        responses = await asyncio.gather(*(http.get("/fast") for _ in range(6)))
        assert all(r.content == b"done" for r in responses)
        assert server.accepted == 2
        slow_calls = [asyncio.create_task(http.get("/slow")) for _ in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(httpx.PoolTimeout):
            await http.get("/fast", timeout=httpx.Timeout(5.0, pool=0.05))
        assert all(r.content == b"done" for r in await asyncio.gather(*slow_calls))


async def test_idle_pool_is_bounded_per_host() -> None:
    async def slow(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.05)
        writer.write(answer(b"x"))
        return True

    transport = LeanTransport(max_keepalive_connections=2)
    async with TinyServer(slow) as server, httpx.AsyncClient(transport=transport) as http:
        await asyncio.gather(*(http.get(server.url) for _ in range(5)))
        assert server.accepted == 5
        assert transport.idle_connections() == 2
        await wait_until(lambda: len(server._handlers) == 2)  # the other 3 were closed


# --- framing --------------------------------------------------------------------------------


async def test_chunked_answer_is_assembled_and_the_connection_reused() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1\r\n \r\n"
        + b"%x\r\n" % 70000
        + b"w" * 70000
        + b"\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    async with TinyServer(always(chunked)) as server, lean_client(server.url) as http:
        for _ in range(2):
            response = await http.get("/c")
            assert response.content == b"hello " + b"w" * 70000
        assert server.accepted == 1


async def test_malformed_chunk_is_a_protocol_error() -> None:
    bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"
    async with TinyServer(always(bad)) as server, lean_client(server.url) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/c")


async def test_answer_framed_by_the_end_of_the_connection() -> None:
    async def http10(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")
        return False  # close

    async with TinyServer(http10) as server, lean_client(server.url) as http:
        assert (await http.get("/a")).content == b"until the end"
        assert (await http.get("/b")).content == b"until the end"
        assert server.accepted == 2


async def test_head_and_204_and_304_have_no_body() -> None:
    async def reply(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        if method == "HEAD":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        elif path == "/204":
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        elif path == "/304":
            writer.write(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + answer(b"body"))
        return True

    async with TinyServer(reply) as server, lean_client(server.url) as http:
        head = await http.head("/h")
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-length"] == "100"
        no_content = await http.get("/204")
        assert no_content.status_code == 204 and no_content.content == b""
        assert (await http.get("/304")).status_code == 304
        after = await http.get("/after")  # the answer after the 103
        assert after.status_code == 200 and after.content == b"body"
        assert server.accepted == 1


async def test_gzip_answer_is_decoded_like_httpx_does() -> None:
    import gzip

    body = gzip.compress(b"squeezed" * 100)
    reply = always(answer(body, extra=b"Content-Encoding: gzip\r\n"))
    async with TinyServer(reply) as server, lean_client(server.url) as http:
        assert (await http.get("/z")).content == b"squeezed" * 100
        transport = LeanTransport()
        try:
            request = httpx.Request("GET", server.url + "/z", extensions={"timeout": {}})
            _, fetched = await transport.fetch(request)  # decoded too: a proxy may compress
            assert fetched == b"squeezed" * 100
        finally:
            await transport.aclose()


# --- Connection: close ----------------------------------------------------------------------


async def test_connection_close_from_the_server() -> None:
    reply = always(answer(b"bye", extra=b"Connection: close\r\n"))
    async with TinyServer(reply) as server, lean_client(server.url) as http:
        for _ in range(3):
            assert (await http.get("/")).content == b"bye"
        assert server.accepted == 3


async def test_connection_close_from_the_client() -> None:
    async with TinyServer(always(answer(b"ok"))) as server, lean_client(server.url) as http:
        for _ in range(3):
            assert (await http.get("/", headers={"Connection": "close"})).content == b"ok"
        assert server.accepted == 3
        assert server.requests[0][2]["connection"] == "close"


# --- stale pooled connections ---------------------------------------------------------------


async def test_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def once(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(b"ok"))  # keep-alive advertised, then closed
        return False

    async with TinyServer(once) as server, lean_client(server.url) as http:
        assert (await http.post("/1", content=b"a")).content == b"ok"
        await wait_until(lambda: not server._handlers)
        await asyncio.sleep(0.05)  # the FIN reaches the client's event loop
        assert (await http.post("/2", content=b"b")).content == b"ok"  # a POST: no retry
        assert server.accepted == 2


def close_when_reused(
    body: bytes = b"ok", extra: bytes = b""
) -> tuple[Reply, list[asyncio.StreamWriter]]:
    """Answers the first request of a connection; closes unanswered on the second."""
    # The writers themselves are kept: keyed by id(), a closed connection's writer could be
    # collected and its id reused by the next connection, which then looked "reused".
    served: list[asyncio.StreamWriter] = []

    async def reply(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        count = sum(1 for w in served if w is writer)
        served.append(writer)
        if count:
            return False  # the close crossed the request: nothing answered
        writer.write(answer(body, extra=extra))
        return True

    return reply, served


@pytest.mark.parametrize(
    ("method", "extensions"), [("GET", None), ("PUT", None), ("POST", {"idempotent": True})]
)
async def test_request_safe_to_repeat_is_resent_once_on_a_fresh_connection(
    method: str, extensions: dict[str, bool] | None
) -> None:
    reply, _ = close_when_reused()
    async with TinyServer(reply) as server, lean_client(server.url) as http:
        assert (await http.request(method, "/1", content=b"x")).content == b"ok"
        second = await http.request(method, "/2", content=b"y", extensions=extensions)
        assert second.content == b"ok"
        assert server.accepted == 2
        assert [r[1] for r in server.requests] == ["/1", "/2", "/2"]


async def test_post_on_a_connection_closed_under_it_is_not_resent() -> None:
    reply, _ = close_when_reused()
    async with TinyServer(reply) as server, lean_client(server.url) as http:
        assert (await http.post("/1", content=b"x")).content == b"ok"
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post("/2", content=b"y")
        assert [r[1] for r in server.requests] == ["/1", "/2"]
        assert (await http.post("/3", content=b"z")).content == b"ok"  # a fresh one
        assert server.accepted == 2


async def test_a_fresh_connection_closed_unanswered_is_not_resent() -> None:
    async def never(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        return False

    async with TinyServer(never) as server, lean_client(server.url) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/")
        assert len(server.requests) == 1


MSGPACK_COUNTS = (packb({"accepted": 1}), b"Content-Type: application/msgpack\r\n")


async def test_replay_client_resends_a_stale_idempotent_call_without_its_own_retry() -> None:
    reply, _ = close_when_reused(*MSGPACK_COUNTS)
    async with TinyServer(reply) as server:
        async with ReplayClient(server.url, retries=0) as rb:
            await rb.drop_table("t")  # DELETE, answered with an empty 200
            await rb.push("t", [{"key": "k", "value": 1}])  # POST marked idempotent
        assert server.accepted == 2
        assert [r[0] for r in server.requests] == ["DELETE", "POST", "POST"]


async def test_replay_client_sample_on_a_connection_closed_under_it_is_unavailable() -> None:
    reply, _ = close_when_reused(*MSGPACK_COUNTS)
    async with TinyServer(reply) as server:
        async with ReplayClient(server.url, retries=3) as rb:
            await rb.drop_table("t")
            with pytest.raises(Unavailable):
                await rb.sample("t", 4)
        assert [r[0] for r in server.requests] == ["DELETE", "POST"]  # sent once


# --- failures -------------------------------------------------------------------------------


async def test_server_dropping_mid_body_is_a_protocol_error_and_not_pooled() -> None:
    async def partial(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        if path == "/cut":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 5000)
            return False
        writer.write(answer(b"ok"))
        return True

    async with TinyServer(partial) as server, lean_client(server.url) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/cut")
        assert (await http.get("/ok")).content == b"ok"
        assert server.accepted == 2


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0) instead of a FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def test_connection_reset_mid_body_is_a_read_error() -> None:
    async def cut(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 5000)
        await writer.drain()
        await asyncio.sleep(0.05)
        reset(writer)
        return False

    async with TinyServer(cut) as server, lean_client(server.url) as http:
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            await http.get("/")


async def test_connect_refused_is_a_connect_error() -> None:
    async with lean_client(f"http://127.0.0.1:{free_port()}") as http:
        with pytest.raises(httpx.ConnectError):
            await http.get("/")


async def test_read_timeout_and_the_connection_is_dropped() -> None:
    async def silent_once(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        if path == "/silent":
            await asyncio.sleep(1.0)
            return False
        writer.write(answer(b"ok"))
        return True

    async with TinyServer(silent_once) as server, lean_client(server.url) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/silent", timeout=httpx.Timeout(5.0, read=0.1))
        assert (await http.get("/ok")).content == b"ok"
        assert server.accepted == 2


async def test_slow_body_within_the_per_read_timeout_is_read() -> None:
    async def trickle(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
        for byte in b"abcde":
            await writer.drain()
            await asyncio.sleep(0.06)
            writer.write(bytes([byte]))
        return True

    async with TinyServer(trickle) as server, lean_client(server.url) as http:
        response = await http.get("/", timeout=httpx.Timeout(5.0, read=0.2))
        assert response.content == b"abcde"  # 0.3 s in all, but never 0.2 s without a byte


@pytest.mark.parametrize(
    "head",
    [
        b"HTP/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n",
    ],
)
async def test_malformed_answers_are_protocol_errors(head: bytes) -> None:
    async with TinyServer(always(head)) as server, lean_client(server.url) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/")


async def test_cancelled_request_closes_its_connection() -> None:
    async def slow(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.5 if path == "/slow" else 0)
        writer.write(answer(b"ok"))
        return True

    transport = LeanTransport()
    async with TinyServer(slow) as server, httpx.AsyncClient(transport=transport) as http:
        call = asyncio.create_task(http.get(server.url + "/slow"))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert transport.idle_connections() == 0
        assert (await http.get(server.url + "/ok")).content == b"ok"
        assert server.accepted == 2


async def test_only_plain_http_and_valid_headers() -> None:
    async with httpx.AsyncClient(transport=LeanTransport()) as http:
        with pytest.raises(httpx.UnsupportedProtocol):
            await http.get("https://127.0.0.1:1/")
    transport = LeanTransport()
    request = httpx.Request("GET", "http://127.0.0.1:1/", headers={"X": "a\r\nEvil: 1"})
    with pytest.raises(httpx.LocalProtocolError):
        await transport.handle_async_request(request)


async def test_closed_transport_closes_idle_connections() -> None:
    transport = LeanTransport()
    async with TinyServer(always(answer(b"ok"))) as server:
        async with httpx.AsyncClient(transport=transport) as http:
            await http.get(server.url)
            assert transport.idle_connections() == 1
        assert transport.idle_connections() == 0
        await wait_until(lambda: not server._handlers)


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        LeanTransport(max_connections=0)
    with pytest.raises(ValueError, match="max_keepalive_connections"):
        LeanTransport(max_keepalive_connections=-1)


# --- the replay client on a real server -----------------------------------------------------


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("fastapi")
    with running_server(Path(tmp_path_factory.mktemp("lean"))) as server:
        yield server.url


def test_replay_client_picks_the_lean_transport_for_http_only() -> None:
    def transport_of(rb: ReplayClient) -> object:
        return rb._requester._http._transport

    assert isinstance(transport_of(ReplayClient("http://127.0.0.1:1")), LeanTransport)
    assert not isinstance(
        transport_of(ReplayClient("http://127.0.0.1:1", lean_transport=False)), LeanTransport
    )
    assert not isinstance(transport_of(ReplayClient("https://127.0.0.1:1")), LeanTransport)


@pytest.mark.parametrize("lean", [True, False])
async def test_replay_client_on_a_real_server(server_url: str, lean: bool) -> None:
    await _round_trips(server_url, f"lean_{lean}", lean)


@pytest.mark.parametrize("lean", [True, False])
def test_replay_client_on_uvloop(server_url: str, lean: bool) -> None:
    """uvloop's transports do not derive from asyncio's classes (the lean transport once
    asserted they did, and every call failed with "the connection is closed")."""
    uvloop.run(_round_trips(server_url, f"uvloop_{lean}", lean))


async def _round_trips(url: str, table: str, lean: bool) -> None:
    """Create, push, get, sample, stream (both layouts), the pipelined writer, drop."""
    rng = np.random.default_rng(0)
    items = [
        {"key": f"k{i}", "value": {"obs": rng.integers(0, 255, 4096, dtype=np.uint8)}}
        for i in range(512)
    ]
    async with ReplayClient(url, lean_transport=lean, max_connections=4) as rb:
        await rb.create_table(table, sampler={"type": "uniform"})
        assert await rb.push(table, items, wait=True) == 512
        got = await rb.get(table, "k7")
        assert got is not None and np.array_equal(got["value"]["obs"], items[7]["value"]["obs"])
        assert await rb.get(table, "missing") is None
        batch = await rb.sample(table, 256)  # a ~1 MiB answer
        assert len(batch) == 256
        by_key = {item["key"]: item["value"]["obs"] for item in items}
        assert all(np.array_equal(b["value"]["obs"], by_key[b["key"]]) for b in batch)
        batches = 0
        async with aclosing(rb.stream(table, batch_size=256, prefetch=4)) as stream:
            async for streamed in stream:
                assert len(streamed) == 256
                batches += 1
                if batches == 20:
                    break
        async with aclosing(rb.stream(table, batch_size=64, layout="columns")) as columns:
            async for stacked in columns:
                assert stacked.columns["obs"].shape == (64, 4096)
                break
        async with rb.writer(table, max_in_flight=4, batch_items=16) as writer:
            for i in range(40):
                await writer.append(f"w{i}", {"obs": items[i]["value"]["obs"]}, 1.0)
        got = await rb.get(table, "w39")
        assert got is not None and np.array_equal(got["value"]["obs"], items[39]["value"]["obs"])
        assert await rb.health()
        await rb.drop_table(table)


async def test_a_unix_socket_connection_sends_through_a_mib_buffer(tmp_path: Path) -> None:
    """A Unix socket holds only what its sender's buffer does: the client's is widened, so
    that a long request body crosses in a few rounds of wake-ups rather than some 80."""
    from rlreplay.clients.connection_pool import ConnectionPool

    path = str(tmp_path / "s.sock")
    accepted: list[asyncio.StreamWriter] = []
    server = await asyncio.start_unix_server(lambda r, w: accepted.append(w), path)
    pool = ConnectionPool(max_idle=1, expiry=30.0, uds=path)
    conn = await pool.connect(("localhost", 80), 10.0)
    try:
        sock = conn._transport.get_extra_info("socket")  # type: ignore[union-attr]
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) > 1 << 20
    finally:
        conn.close()
        await conn.wait_closed()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
