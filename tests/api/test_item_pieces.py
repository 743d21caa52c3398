"""Items-layout answers holding large values go out in pieces: the stored values where they
lie, the same msgpack once joined, each value's first array at a multiple of 8."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlreplay.app.api import envelopes
from rlreplay.app.api.gathered_writes import AnswerPieces
from rlreplay.app.tables.items import Item, ItemBatch, SampleBatch
from rlreplay.clients.columns import decode_views
from rlreplay.wire.arrays import BFloat16Array
from rlreplay.wire.codec import packb, unpackb
from rlreplay.wire.packing import pack_pieces

_RNG = np.random.default_rng(0)


def _values() -> list[bytes]:
    """Values of several sizes, dtypes and layouts, two of them large."""
    return [
        packb({"tokens": _RNG.integers(0, 9, 20_000, np.int32), "logp": np.ones(20_000, ">f8")}),
        packb({"x": np.arange(3, dtype=np.float32)}),
        packb({"obs": _RNG.standard_normal((130, 70)).astype(np.float64), "r": 1.5}),
        packb({"reward": 0.5, "bits": np.zeros(100, bool)}),
        packb([1, 2, 3]),
    ]


def _keys(n: int) -> list[str]:
    return [f"k{'é' * i}{i}" for i in range(n)]  # heads of several lengths


def _items() -> list[Item | None]:
    out: list[Item | None] = [
        Item(key=key, value=value, priority=0.5 + i, inserted_at=7.0, times_sampled=i)
        for i, (key, value) in enumerate(zip(_keys(5), _values(), strict=True))
    ]
    out.insert(2, None)
    return out


def _sample(rollout: bool) -> SampleBatch:
    values = _values()
    n = len(values)
    batch = SampleBatch(
        keys=_keys(n),
        values=list(values),
        priorities=np.linspace(0.1, 1, n),
        probabilities=np.full(n, 0.2),
        weights=np.ones(n),
        times_sampled=np.arange(n, dtype=np.int64),
    )
    if rollout:
        batch.groups = ["g", None, "h", None, None]
        batch.versions = [3, None, 4, None, 5]
        batch.tags = [{"a": 1}, None, None, {"b": "c"}, None]
    return batch


def _both(build: Any, arg: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, AnswerPieces]:
    monkeypatch.setattr(envelopes, "SEND_AS_THEY_LIE", False)
    joined = build(arg)
    monkeypatch.setattr(envelopes, "SEND_AS_THEY_LIE", True)
    pieces = build(arg)
    assert type(joined) is bytes and type(pieces) is AnswerPieces
    return joined, pieces


def _check(joined: bytes, pieces: AnswerPieces, stored: list[bytes]) -> None:
    body = pieces.join()
    assert len(body) == len(pieces)
    assert _plain(unpackb(body)) == _plain(unpackb(joined))
    large = [value for value in stored if len(value) >= envelopes.LARGE_PIECE_BYTES]
    assert len(large) == 2
    for value in large:  # the stored bytes themselves, not copies
        assert any(piece is value for piece in pieces.pieces)
    buffer = bytearray(body)
    base = np.frombuffer(buffer, np.uint8).ctypes.data
    firsts = [
        next(iter(item["value"].values()))
        for item in decode_views(memoryview(buffer))["items"]
        if item is not None and isinstance(item["value"], dict)
    ]
    arrays = [first for first in firsts if isinstance(first, np.ndarray)]
    assert len(arrays) == 3
    assert all((array.ctypes.data - base) % envelopes.ALIGNMENT == 0 for array in arrays)


def _plain(obj: Any) -> Any:
    """``obj`` with arrays as (dtype, shape, bytes), comparable with ``==``."""
    if isinstance(obj, np.ndarray):
        return obj.dtype.str, obj.shape, obj.tobytes()
    if isinstance(obj, dict):
        return {key: _plain(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_plain(value) for value in obj]
    return obj


def test_a_batch_get_with_large_values_goes_out_in_aligned_pieces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    items = _items()
    joined, pieces = _both(envelopes.items_msgpack, items, monkeypatch)
    _check(joined, pieces, [item.value for item in items if item is not None])


@pytest.mark.parametrize("rollout", [False, True])
def test_a_sample_with_large_values_goes_out_in_aligned_pieces(
    monkeypatch: pytest.MonkeyPatch, rollout: bool
) -> None:
    batch = _sample(rollout)
    joined, pieces = _both(envelopes.sample_msgpack, batch, monkeypatch)
    _check(joined, pieces, [value for value in batch.values if value is not None])


def test_small_values_are_joined() -> None:
    small = [
        Item(key="a", value=packb({"x": np.zeros(10)}), priority=1, inserted_at=0, times_sampled=0)
    ]
    assert type(envelopes.items_msgpack(small)) is bytes


def test_an_empty_bfloat16_array_of_several_axes_packs_in_pieces() -> None:
    value = {"a": BFloat16Array(np.zeros((0, 2), np.uint16)), "big": np.zeros(70_000, np.uint8)}
    assert bytes(pack_pieces(value)) == packb(value)


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("missing", [False, True])
def test_a_batch_get_answer_built_from_columns_is_the_per_item_one(
    large: bool, missing: bool
) -> None:
    values = _values() if large else [packb({"x": np.full(5, i)}) for i in range(5)]
    batch = ItemBatch(
        keys=_keys(5),
        values=[None if missing and i == 1 else v for i, v in enumerate(values)],
        priorities=np.linspace(0.1, 1, 5),
        inserted_at=np.arange(5, dtype=np.float64) + 1e9,
        times_sampled=np.array([0, 1, 2**40, 3, 4], dtype=np.int64),
    )
    got, want = envelopes.item_batch_msgpack(batch), envelopes.items_msgpack(batch.items())
    assert type(got) is type(want)
    assert (got.join() if isinstance(got, AnswerPieces) else got) == (
        want.join() if isinstance(want, AnswerPieces) else want
    )
