"""A long request body goes to the socket as it is, after its head, not joined to it."""

from __future__ import annotations

from typing import Any, cast

from rlreplay.clients.connection import Connection
from rlreplay.clients.exchange import write_request
from rlreplay.wire.pieces import Pieces


class _Recorder:
    """The two calls of :class:`Connection` that ``write_request`` makes, recorded."""

    def __init__(self) -> None:
        self.writes: list[Any] = []

    def write(self, data: Any) -> None:
        self.writes.append(data)

    async def drain(self) -> None:
        return None


async def test_a_long_body_is_written_as_it_is() -> None:
    recorder = _Recorder()
    body = bytes(1 << 20)
    await write_request(cast(Connection, recorder), b"POST / HTTP/1.1\r\n\r\n", body, None)
    assert recorder.writes[0] == b"POST / HTTP/1.1\r\n\r\n"
    assert recorder.writes[1] is body  # not a copy


async def test_a_short_body_goes_in_one_write_with_its_head() -> None:
    recorder = _Recorder()
    await write_request(cast(Connection, recorder), b"HEAD\r\n\r\n", b"tiny", None)
    assert recorder.writes == [b"HEAD\r\n\r\ntiny"]


async def test_a_long_piece_goes_in_steps_of_a_mib_each_a_view_of_it() -> None:
    recorder = _Recorder()
    keys, data = b"\x82\xa4keys\x90\xa7columns", bytes(range(256)) * (5 * 4096 + 3)
    await write_request(cast(Connection, recorder), b"POST\r\n\r\n", Pieces([keys, data]), None)
    head, *steps = recorder.writes
    assert head == b"POST\r\n\r\n" + keys  # the short first part goes with the head
    assert [len(step) for step in steps] == [1 << 20] * 5 + [768]
    assert all(isinstance(step, memoryview) and step.obj is data for step in steps)
    assert b"".join(steps) == data
