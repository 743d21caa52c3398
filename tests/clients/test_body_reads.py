"""A long answer body wakes its reader once, when it is complete, and still times out when
no byte comes for the read timeout."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import rlreplay.clients.connection as connection
from tests.clients.test_clients_transport import TinyServer, lean_client

BODY = bytes(range(256)) * 4096  # 1 MiB
PIECES = 16


async def _in_pieces(method: str, path: str, writer: asyncio.StreamWriter) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY))
    step = len(BODY) // PIECES
    for start in range(0, len(BODY), step):
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(BODY[start : start + step])
        if path == "/stall" and start:
            await asyncio.sleep(5.0)
            return False
    return True


async def test_a_long_body_in_pieces_wakes_its_reader_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits = 0
    wait = connection.Connection._wait

    async def counted(self: connection.Connection, timeout_s: float | None) -> None:
        nonlocal waits
        if self._body is not None:
            waits += 1
        await wait(self, timeout_s)

    monkeypatch.setattr(connection.Connection, "_wait", counted)
    async with TinyServer(_in_pieces) as server, lean_client(server.url) as http:
        response = await http.get("/", timeout=httpx.Timeout(5.0))
    assert response.content == BODY
    assert waits == 1  # not one per piece


async def test_a_long_body_slower_than_the_read_timeout_in_all_is_read() -> None:
    async with TinyServer(_in_pieces) as server, lean_client(server.url) as http:
        response = await http.get("/", timeout=httpx.Timeout(5.0, read=0.2))
    assert response.content == BODY  # 0.3 s in all, never 0.2 s without a byte


async def test_a_long_body_that_stalls_times_out() -> None:
    async with TinyServer(_in_pieces) as server, lean_client(server.url) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/stall", timeout=httpx.Timeout(5.0, read=0.2))
