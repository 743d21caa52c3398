"""Random selectors draw with the probabilities they promise (chi-square, fixed seeds).

Each test draws a few hundred thousand times from a fixed seed and compares the counts
with the expected distribution; a p-value under 1e-4 fails. With the seeds fixed the
outcome is deterministic, and a wrong distribution (say, off by a few percent on one
item) gives p-values many orders of magnitude lower.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from scipy.stats import chisquare

from rlreplay.app.selection.base import Selector
from rlreplay.app.selection.prioritized import PrioritizedSampler
from rlreplay.app.selection.ptime import PTimeSampler
from rlreplay.app.selection.uniform import UniformSampler

DRAWS = 300_000
P_MIN = 1e-4


def slots(*values: int) -> npt.NDArray[np.int64]:
    return np.asarray(values, dtype=np.int64)


def assert_draws_follow(
    selector: Selector, expected: dict[int, float], seed: int, batch: int = 1000
) -> None:
    """Draws DRAWS times, batch by batch, and checks counts and reported probabilities."""
    rng = np.random.default_rng(seed)
    order = np.array(sorted(expected), dtype=np.int64)
    lookup = np.full(int(order.max()) + 1, -1, dtype=np.int64)
    lookup[order] = np.arange(len(order))
    wanted_p = np.array([expected[s] for s in order.tolist()])
    observed = np.zeros(len(order))
    for _ in range(DRAWS // batch):
        picked, probs = selector.sample(batch, rng)
        assert picked.shape == probs.shape == (batch,)
        assert np.all(picked <= order.max()), "drew a slot that should not be drawn"
        index = lookup[picked]
        assert np.all(index >= 0), f"drew slots {set(picked[index < 0].tolist())}"
        np.testing.assert_allclose(probs, wanted_p[index], rtol=1e-9)
        observed += np.bincount(index, minlength=len(order))
    wanted = wanted_p * DRAWS
    assert wanted.sum() == pytest.approx(observed.sum())
    p_value = chisquare(observed, wanted).pvalue
    assert p_value > P_MIN, f"p = {p_value:.3g}; counts {observed} vs expected {wanted}"


def test_uniform_after_removals() -> None:
    sampler = UniformSampler()
    sampler.insert(np.arange(40), np.ones(40), np.zeros(40))
    sampler.remove(slots(0, 7, 39, 12))
    held = sorted(set(range(40)) - {0, 7, 39, 12})
    assert_draws_follow(sampler, {s: 1 / len(held) for s in held}, seed=1)


def prioritized_expected(priorities: dict[int, float], alpha: float) -> dict[int, float]:
    masses = {s: p**alpha for s, p in priorities.items() if p > 0}
    total = sum(masses.values())
    return {s: m / total for s, m in masses.items()}


def test_prioritized_matches_priorities_after_updates_and_deletes() -> None:
    rng = np.random.default_rng(7)
    priorities = {s: float(p) for s, p in enumerate(rng.uniform(0.1, 5.0, size=30))}
    sampler = PrioritizedSampler(exponent=0.7)
    sampler.insert(np.arange(30), np.array([priorities[s] for s in range(30)]), np.zeros(30))
    changed = slots(3, 4, 5, 20, 21)
    new = np.array([9.0, 0.01, 0.0, 2.5, 7.0])
    sampler.update(changed, new)
    priorities.update(zip(changed.tolist(), new.tolist(), strict=True))
    sampler.remove(slots(0, 21, 29))
    for gone in (0, 21, 29):
        del priorities[gone]
    expected = prioritized_expected(priorities, 0.7)
    assert 5 not in expected  # priority 0: never drawn
    assert_draws_follow(sampler, expected, seed=2)


def test_prioritized_survives_slot_reuse_and_growth() -> None:
    sampler = PrioritizedSampler(exponent=1.0)
    sampler.insert(slots(0, 1, 2), np.array([1.0, 2.0, 3.0]), np.zeros(3))
    sampler.remove(slots(1))
    sampler.insert(slots(1, 5000), np.array([4.0, 2.0]), np.zeros(2))  # reuse and grow
    assert_draws_follow(sampler, {0: 0.1, 1: 0.4, 2: 0.3, 5000: 0.2}, seed=3)


def test_prioritized_with_all_priorities_zero_is_uniform() -> None:
    sampler = PrioritizedSampler()
    sampler.insert(np.arange(10), np.zeros(10), np.zeros(10))
    assert_draws_follow(sampler, {s: 0.1 for s in range(10)}, seed=4)
    sampler.update(slots(3), np.array([2.0]))
    picked, probs = sampler.sample(1000, np.random.default_rng(5))
    assert set(picked.tolist()) == {3} and np.all(probs == 1.0)


def test_prioritized_zero_priority_never_drawn_among_tiny_ones() -> None:
    sampler = PrioritizedSampler(exponent=1.0)
    n = 4096
    priorities = np.where(np.arange(n) % 2 == 0, 0.0, 1e-300)
    sampler.insert(np.arange(n), priorities, np.zeros(n))
    picked, _ = sampler.sample(200_000, np.random.default_rng(6))
    assert np.all(picked % 2 == 1)


def test_prioritized_exponent_zero_is_uniform_over_positive_priorities() -> None:
    sampler = PrioritizedSampler(exponent=0.0)
    sampler.insert(np.arange(6), np.array([0.0, 1.0, 50.0, 0.0, 3.0, 1e-9]), np.zeros(6))
    assert_draws_follow(sampler, {1: 0.25, 2: 0.25, 4: 0.25, 5: 0.25}, seed=8)


def test_ptime_halves_per_half_life() -> None:
    sampler = PTimeSampler(half_life_s=10.0)
    times = np.array([1000.0, 990.0, 980.0, 970.0, 1000.0, 995.0])
    sampler.insert(np.arange(6), np.ones(6), times)
    masses = 2.0 ** ((times - 1000.0) / 10.0)
    expected = {s: float(m / masses.sum()) for s, m in enumerate(masses)}
    assert_draws_follow(sampler, expected, seed=9)


def test_ptime_after_removals() -> None:
    sampler = PTimeSampler(half_life_s=2.0)
    times = np.arange(20, dtype=np.float64)
    sampler.insert(np.arange(20), np.ones(20), times)
    sampler.remove(slots(19, 18, 5))
    held = [s for s in range(20) if s not in (19, 18, 5)]
    masses = {s: 2.0 ** (times[s] / 2.0) for s in held}
    total = sum(masses.values())
    assert_draws_follow(sampler, {s: m / total for s, m in masses.items()}, seed=10)
