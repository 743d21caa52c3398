"""The example plugin: always the item with the highest ``score`` field."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rlreplay_score_sampler import HighestScoreSampler, score_of

RNG = np.random.default_rng(0)


def drain(sampler: HighestScoreSampler) -> list[int]:
    order = []
    while len(sampler):
        slot = int(sampler.sample(1, RNG)[0][0])
        order.append(slot)
        sampler.remove(np.array([slot], dtype=np.int64))
    return order


def test_highest_score_first_missing_last_ties_by_insertion() -> None:
    sampler = HighestScoreSampler()
    fields: list[dict[str, object]] = [
        {"score": 1.5},
        {},
        {"score": 7},
        {"score": "x"},
        {"score": 7.0},
        {"score": -2.0},
    ]
    sampler.insert(np.arange(6, dtype=np.int64), np.ones(6), np.zeros(6), fields)
    assert drain(sampler) == [2, 4, 0, 5, 1, 3]


def test_priorities_do_not_matter_and_reinsert_moves_item() -> None:
    sampler = HighestScoreSampler()
    sampler.insert(
        np.arange(3, dtype=np.int64),
        np.ones(3),
        np.zeros(3),
        [{"score": 1.0}, {"score": 2.0}, {"score": 3.0}],
    )
    sampler.update(np.array([0], dtype=np.int64), np.array([100.0]))
    assert int(sampler.sample(1, RNG)[0][0]) == 2
    sampler.remove(np.array([2], dtype=np.int64))
    sampler.insert(np.array([2], dtype=np.int64), np.ones(1), np.zeros(1), [{"score": 0.5}])
    assert drain(sampler) == [1, 0, 2]


def test_stale_entries_are_collected() -> None:
    sampler = HighestScoreSampler()
    for round_ in range(50):
        batch = np.arange(round_ * 100, round_ * 100 + 100, dtype=np.int64)
        sampler.insert(batch, np.ones(100), np.zeros(100), [{"score": float(s)} for s in batch])
        if round_:
            sampler.remove(batch - 100)
    assert len(sampler) == 100
    assert len(sampler._heap) <= 2 * 100 + 64 + 100
    assert int(sampler.sample(1, RNG)[0][0]) == 4999
    assert sampler.index_bytes() > 0


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"score": 3}, 3.0),
        ({}, -math.inf),
        (None, -math.inf),
        ({"score": True}, -math.inf),
        ({"score": float("nan")}, -math.inf),
        ({"score": [1]}, -math.inf),
    ],
)
def test_score_of(fields: dict[str, object] | None, expected: float) -> None:
    assert score_of(fields) == expected
