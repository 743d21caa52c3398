"""Push bodies: flat values go with the body in one pass, others are packed first; the
server reads the same items either way."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest

from rlreplay.clients.bodies import encode_body, push_request
from rlreplay.wire.codec import packb
from rlreplay.wire.schemas import PushRequest

_READ = msgspec.msgpack.Decoder(PushRequest)


def _as_server_reads(body: bytes) -> list[tuple[str, bytes, float, Any, Any]]:
    """Each item as the server keeps it: the value's msgpack bytes as sent."""
    return [
        (item.key, bytes(item.value), item.priority, item.group, item.version)
        for item in _READ.decode(body).items
    ]


@pytest.mark.parametrize(
    "value",
    [
        {"x": np.arange(12, dtype="<f4").reshape(3, 4), "r": 1.5, "done": False, "n": 7},
        {"x": np.arange(12, dtype=">i8")[::2], "s": "text", "b": b"raw", "none": None},
        {"nested": {"x": np.zeros(2)}},  # not flat: packed first
        [np.ones(3), 2],  # not a map
    ],
)
def test_a_push_body_carries_each_value_as_the_codec_packs_it(value: Any) -> None:
    items = [
        {"key": "a", "value": value},
        {"key": "b", "value": value, "priority": np.float32(2.5), "group": "g", "version": 3},
    ]
    read = _as_server_reads(encode_body(push_request(items, False)))
    assert read == [
        ("a", packb(value), 1.0, msgspec.UNSET, msgspec.UNSET),
        ("b", packb(value), 2.5, "g", 3),
    ]


def test_an_int_past_64_bits_in_a_flat_value_is_refused() -> None:
    with pytest.raises(ValueError):
        encode_body(push_request([{"key": "a", "value": {"n": 2**64}}], False))


_COLUMNS = {
    "big": np.arange(3 * 40_000, dtype="<i4").reshape(3, 40_000),  # a piece of its own
    "fortran": np.asfortranarray(np.arange(3 * 30_000, dtype=">f8").reshape(3, 30_000)),
    "small": np.arange(6, dtype=np.float16).reshape(3, 2),
    "r": np.array([1.0, 2.0, 3.0]),
}


@pytest.mark.parametrize("meta", [{}, {"tags": [{"a": 1}, None, {"b": "x"}], "reservation": "r"}])
def test_a_columnar_body_in_pieces_is_the_body_joined(meta: dict[str, Any]) -> None:
    from rlreplay.clients.bodies import columns_request
    from rlreplay.wire.pieces import Pieces
    from rlreplay.wire.schemas import ColumnsPushRequest

    keys = ["k0", "é" * 40, "k" * 300]  # key headers of three lengths
    body = columns_request(keys, _COLUMNS, [1.0, 2.0, 0.5], True, meta)  # type: ignore[arg-type]
    body.request_id = "rid-1"
    sent = encode_body(body)
    assert isinstance(sent, Pieces)
    # the arrays' long data goes as views of their memory, not copied into the body
    assert any(isinstance(p, memoryview) and p.nbytes == _COLUMNS["big"].nbytes for p in sent.parts)
    joined = msgspec.structs.replace(body, columns=msgspec.Raw(packb(_COLUMNS)))
    assert bytes(sent) == msgspec.msgpack.encode(joined) and len(sent) == len(bytes(sent))
    read = msgspec.msgpack.decode(bytes(sent), type=ColumnsPushRequest)
    assert read.keys == keys and bytes(read.columns) == packb(_COLUMNS)
    assert bytes(encode_body(body)) == bytes(sent)  # encoded again (a retry): the same


def test_a_push_of_large_values_in_pieces_is_the_body_joined() -> None:
    from rlreplay.wire.pieces import Pieces
    from rlreplay.wire.schemas import ItemIn

    big = np.arange(3 * 30_000, dtype="<f4").reshape(3, 30_000)
    items = [
        {"key": "a", "value": {"x": big, "r": 1.0}},
        {"key": "é" * 50, "value": {"x": big[::-1].copy(), "s": "t"}, "priority": 2.0},
        {"key": "c", "value": {"x": np.asfortranarray(big)}, "group": "g", "tags": {"k": 1}},
    ]
    body = push_request(items, True, reservation="r1")
    body.request_id = "rid"
    sent = encode_body(body)
    assert isinstance(sent, Pieces)
    # each array a view (the Fortran one of its copy in C order, which the codec makes)
    assert sum(isinstance(p, memoryview) and p.nbytes == big.nbytes for p in sent.parts) == 3
    expected = PushRequest(
        [
            ItemIn("a", msgspec.Raw(packb(items[0]["value"]))),
            ItemIn("é" * 50, msgspec.Raw(packb(items[1]["value"])), 2.0),
            ItemIn("c", msgspec.Raw(packb(items[2]["value"])), group="g", tags={"k": 1}),
        ],
        True,
        "rid",
        "r1",
    )
    assert bytes(sent) == msgspec.msgpack.encode(expected)
    assert _as_server_reads(bytes(sent))[1][1] == packb(items[1]["value"])
