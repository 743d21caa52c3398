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
