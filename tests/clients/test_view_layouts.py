"""The client's array views take a shortcut for a payload laid out as the last one (same
length, same bytes before the data); payloads of one length but another dtype, shape, byte
order or alignment, met in any order and by threads decoding at once, still decode to
their own arrays, bit for bit, as the copying decoder gives them."""

from __future__ import annotations

import math
import threading
from typing import Any

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlreplay.clients import columns
from rlreplay.clients.columns import decode_views
from rlreplay.wire.arrays import BFloat16Array
from rlreplay.wire.codec import packb, unpackb
from tests.wire.test_codec import DTYPES

#: Arrays of 16 bytes each, as payloads of one length: only the bytes before the data differ.
SAME_LENGTH: list[Any] = [
    np.arange(4, dtype="<f4"),
    np.arange(4, dtype="<i4"),
    np.arange(4, dtype=">f4"),
    np.arange(4, dtype="<i4").reshape(2, 2),
    np.arange(16, dtype=np.uint8),
    np.arange(2, dtype="<f8"),
    BFloat16Array(np.arange(8, dtype=np.uint16)),
]


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, BFloat16Array):
        return isinstance(got, BFloat16Array) and got == want
    return (
        isinstance(got, np.ndarray)
        and (got.dtype.str, got.shape) == (want.dtype.str, want.shape)
        and got.tobytes() == want.tobytes()
    )


def _body(value: Any, shift: int = 0) -> memoryview:
    """``value`` packed, in a writable buffer, starting ``shift`` bytes past an aligned
    address (so that arrays of a wide dtype may lie misaligned)."""
    packed = packb(value)
    buffer = bytearray(len(packed) + 16)
    start = (-np.frombuffer(buffer, np.uint8).ctypes.data) % 8 + shift
    view = memoryview(buffer)[start : start + len(packed)]
    view[:] = packed
    return view


def test_payloads_of_one_length_and_other_layouts_decode_to_their_own_arrays() -> None:
    order = [SAME_LENGTH[i % len(SAME_LENGTH)] for i in (0, 0, 1, 0, 2, 3, 3, 4, 5, 6, 6, 0)]
    for shift in range(8):
        got = decode_views(_body({"items": [{"a": a} for a in order]}, shift))
        assert all(_same(g["a"], a) for g, a in zip(got["items"], order, strict=True))


def test_arrays_are_views_of_the_answer_where_aligned_and_copies_elsewhere() -> None:
    for dtype in ("<f8", "<i4", ">f4", "<u2"):
        in_place_by_shift = []
        for shift in range(8):
            body = _body([np.arange(3, dtype=dtype)] * 2, shift)
            got = decode_views(body)
            assert all(a.tolist() == [0, 1, 2] and a.flags.aligned for a in got)
            in_place_by_shift.append(np.shares_memory(got[0], np.frombuffer(body, np.uint8)))
            got[0][0] = 7  # the caller's to write
            assert got[1][0] == 0
        # the data lies in place at one shift of every alignment's steps
        assert in_place_by_shift.count(True) == 8 // np.dtype(dtype).alignment


def test_threads_decoding_other_layouts_at_once_get_their_own_arrays() -> None:
    bodies = [(_body([a] * 200), a) for a in SAME_LENGTH]
    failures: list[str] = []

    def decode(body: memoryview, want: Any) -> None:
        for _ in range(50):
            if not all(_same(got, want) for got in decode_views(body)):
                failures.append(repr(want))
                return

    threads = [threading.Thread(target=decode, args=pair) for pair in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


@st.composite
def arrays(draw: st.DrawFn) -> Any:
    dtype = draw(st.one_of(DTYPES, st.just("bfloat16")))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    size = math.prod(shape) * (2 if dtype == "bfloat16" else np.dtype(dtype).itemsize)
    raw = draw(st.binary(min_size=size, max_size=size))
    if dtype == "bfloat16":
        return BFloat16Array(np.frombuffer(raw, np.uint16).reshape(shape).copy())
    if np.dtype(dtype).kind == "b":
        return (np.frombuffer(raw, np.uint8) & 1).astype(bool).reshape(shape)
    return np.frombuffer(raw, dtype).reshape(shape).copy()


@given(
    batch=st.lists(arrays(), min_size=1, max_size=6),
    repeats=st.lists(st.integers(0, 5), min_size=1, max_size=12),
    shift=st.integers(0, 7),
)
@settings(max_examples=200, deadline=None)
def test_any_sequence_of_arrays_decodes_as_the_copying_decoder_does(
    batch: list[Any], repeats: list[int], shift: int
) -> None:
    order = [batch[i % len(batch)] for i in repeats]
    body = _body({"items": [{"value": {"a": a}} for a in order]}, shift)
    got = decode_views(body)["items"]
    want = unpackb(bytes(body))["items"]
    for g, w, a in zip(got, want, order, strict=True):
        assert _same(g["value"]["a"], a) and _same(w["value"]["a"], a)


def test_the_off_arm_decodes_the_same_arrays() -> None:
    seen = msgspec.msgpack.Decoder(ext_hook=columns._array_view_seen)
    for shift in range(8):
        body = _body(SAME_LENGTH * 2, shift)
        assert all(_same(g, a) for g, a in zip(seen.decode(body), SAME_LENGTH * 2, strict=True))
