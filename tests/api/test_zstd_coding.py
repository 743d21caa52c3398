"""The server's zstd coding layer in process: request bodies decompressed within the limit,
other codings refused, answers compressed for clients that ask."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from rlreplay.app.api.compression import ZstdCoding
from rlreplay.app.api.gathered_writes import AnswerPieces
from rlreplay.wire.compression import (
    MIN_BYTES,
    TooLarge,
    accepts_zstd,
    compress,
    decompress,
    decompress_into,
)

pytest.importorskip("zstandard")

BODY = b"tokens " * 10_000


async def _echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers with the request body it read, in two pieces, and the content-length seen."""
    message = await receive()
    body = message["body"]
    length = dict(scope["headers"]).get(b"content-length", b"")
    half = len(body) // 2
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(body)).encode()), (b"x-length", length)],
        }
    )
    await send(
        {"type": "http.response.body", "body": AnswerPieces([body[:half], body[half:]], len(body))}
    )


async def _call(app: Any, body: bytes, headers: list[tuple[bytes, bytes]]) -> list[Message]:
    scope = {"type": "http", "method": "POST", "path": "/v1/x", "headers": headers}
    sent: list[Message] = []
    queue = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def _body(messages: list[Message]) -> bytes:
    body = messages[1]["body"]
    return body.join() if isinstance(body, AnswerPieces) else bytes(body)


async def test_a_zstd_request_body_reaches_the_route_decompressed() -> None:
    app = ZstdCoding(_echo, max_body_bytes=1 << 20)
    sent = await _call(app, compress([BODY]), [(b"content-encoding", b"zstd")])
    headers = dict(sent[0]["headers"])
    assert sent[0]["status"] == 200 and headers[b"x-length"] == str(len(BODY)).encode()
    assert b"content-encoding" not in headers  # not asked for
    assert _body(sent) == BODY


async def test_an_answer_is_compressed_for_a_client_that_asks() -> None:
    app = ZstdCoding(_echo, max_body_bytes=1 << 20)
    sent = await _call(app, BODY, [(b"accept-encoding", b"gzip, zstd;q=0.9")])
    headers = dict(sent[0]["headers"])
    assert headers[b"content-encoding"] == b"zstd"
    assert int(headers[b"content-length"]) == len(sent[1]["body"]) < len(BODY) // 10
    assert decompress(sent[1]["body"], len(BODY)) == BODY
    short = await _call(app, b"x" * (MIN_BYTES - 1), [(b"accept-encoding", b"zstd")])
    assert b"content-encoding" not in dict(short[0]["headers"])
    refused = await _call(app, BODY, [(b"accept-encoding", b"zstd;q=0")])
    assert b"content-encoding" not in dict(refused[0]["headers"])


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (compress([BODY]), [(b"content-encoding", b"zstd")], 413),
        (BODY, [(b"content-encoding", b"zstd")], 400),
        (BODY, [(b"content-encoding", b"gzip")], 415),
    ],
    ids=["too large decompressed", "not zstd", "another coding"],
)
async def test_bodies_it_cannot_take_are_refused(
    body: bytes, headers: list[tuple[bytes, bytes]], status: int
) -> None:
    app = ZstdCoding(_echo, max_body_bytes=len(BODY) - 1)
    sent = await _call(app, body, headers)
    assert sent[0]["status"] == status


def test_the_codec_helpers() -> None:
    assert accepts_zstd(b"zstd") and accepts_zstd("gzip, ZSTD;q=0.5")
    assert not accepts_zstd(b"gzip") and not accepts_zstd("zstd;q=0")
    frame = compress([memoryview(BODY), b"", BODY[:10]])
    assert decompress(frame, 2 * len(BODY)) == BODY + BODY[:10]
    with pytest.raises(TooLarge):
        decompress(frame, len(BODY))
    taken: list[int] = []

    def take(size: int) -> memoryview:
        taken.append(size)
        return memoryview(bytearray(size))

    assert bytes(decompress_into(frame, take)) == BODY + BODY[:10]
    assert taken == [len(BODY) + 10]
    with pytest.raises(ValueError, match="zstd"):
        decompress_into(b"not zstd at all", take)
