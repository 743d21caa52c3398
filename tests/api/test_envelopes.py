"""The hand-laid msgpack answers of ``envelopes`` read back as msgpack-python packs them."""

from __future__ import annotations

import msgpack
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlreplay.app.api.envelopes import items_msgpack, sample_msgpack
from rlreplay.app.tables.items import Item, SampleBatch
from rlreplay.wire.schemas import MAX_KEY_BYTES

# keys of every str header size up to the limit: fixstr, str8 and str16, ASCII or not
_KEYS = st.one_of(
    st.text(min_size=1, max_size=40),
    st.text(alphabet="ab", min_size=200, max_size=300),
    st.text(alphabet="é", min_size=128, max_size=MAX_KEY_BYTES // 2),
)
_VALUES = st.one_of(st.none(), st.binary(max_size=64).map(msgpack.packb))
_FLOATS = st.floats(min_value=0, allow_nan=False)
_PICK = st.tuples(_KEYS, _VALUES, _FLOATS, _FLOATS, _FLOATS, st.integers(0, 2**63 - 1))
_ROLLOUT = st.tuples(
    st.one_of(st.none(), st.text(max_size=8)), st.one_of(st.none(), st.integers(0, 2**40))
)


def _batch(picks: list[tuple[str, bytes | None, float, float, float, int]]) -> SampleBatch:
    keys, values, priorities, probabilities, weights, times = (
        zip(*picks, strict=True) if picks else [()] * 6
    )
    return SampleBatch(
        keys=list(keys),
        values=list(values),
        priorities=np.array(priorities, dtype=np.float64),
        probabilities=np.array(probabilities, dtype=np.float64),
        weights=np.array(weights, dtype=np.float64),
        times_sampled=np.array(times, dtype=np.int64),
    )


def _expected(picks: list[tuple[str, bytes | None, float, float, float, int]]) -> dict[str, object]:
    return {
        "items": [
            {
                "key": key,
                "value": None if value is None else msgpack.unpackb(value),
                "priority": priority,
                "probability": probability,
                "weight": weight,
                "times_sampled": times,
            }
            for key, value, priority, probability, weight, times in picks
        ]
    }


@settings(max_examples=60, deadline=None)
@given(st.lists(_PICK, max_size=20))
def test_sample_answer_reads_back_as_packed(
    picks: list[tuple[str, bytes | None, float, float, float, int]],
) -> None:
    assert msgpack.unpackb(sample_msgpack(_batch(picks))) == _expected(picks)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(_PICK, _ROLLOUT), min_size=1, max_size=8))
def test_sample_answer_with_rollout_fields(
    picks: list[
        tuple[tuple[str, bytes | None, float, float, float, int], tuple[str | None, int | None]]
    ],
) -> None:
    batch = _batch([pick for pick, _ in picks])
    batch.groups = [group for _, (group, _) in picks]
    batch.versions = [version for _, (_, version) in picks]
    expected = _expected([pick for pick, _ in picks])
    for item, (_, (group, version)) in zip(expected["items"], picks, strict=True):  # type: ignore[call-overload]
        if group is not None:
            item["group"] = group
        if version is not None:
            item["version"] = version
    assert msgpack.unpackb(sample_msgpack(batch)) == expected


def test_item_answer_keeps_missing_items_as_nil() -> None:
    item = Item("k", msgpack.packb({"x": 1}), 2.0, 3.0, 4)
    assert msgpack.unpackb(items_msgpack([item, None])) == {
        "items": [
            {
                "key": "k",
                "value": {"x": 1},
                "priority": 2.0,
                "inserted_at": 3.0,
                "times_sampled": 4,
            },
            None,
        ]
    }
