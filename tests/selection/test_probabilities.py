"""Reported probabilities and importance weights equal the formulas, to float64 rounding."""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay.app.selection.prioritized import PrioritizedSampler
from rlreplay.app.selection.ptime import PTimeSampler
from rlreplay.app.selection.sum_tree import SumTree


@pytest.mark.parametrize("alpha", [0.0, 0.4, 0.6, 1.0, 2.5])
def test_prioritized_probabilities_are_p_to_alpha_over_sum(alpha: float) -> None:
    rng = np.random.default_rng(11)
    n = 3000
    priorities = rng.exponential(1.0, size=n)
    priorities[::17] = 0.0
    sampler = PrioritizedSampler(exponent=alpha)
    sampler.insert(np.arange(n), priorities, np.zeros(n))
    masses = np.where(priorities > 0, priorities**alpha, 0.0)
    truth = masses / masses.sum()
    picked, probs = sampler.sample(5000, rng)
    np.testing.assert_allclose(probs, truth[picked], rtol=1e-12)
    assert np.all(priorities[picked] > 0)


def test_prioritized_weights_are_normalised_is_weights() -> None:
    rng = np.random.default_rng(12)
    n = 500
    priorities = rng.uniform(0.01, 10, size=n)
    sampler = PrioritizedSampler(exponent=0.6, is_exponent=0.4)
    sampler.insert(np.arange(n), priorities, np.zeros(n))
    picked, probs = sampler.sample(64, rng)
    weights = sampler.weights(probs, n)
    masses = priorities**0.6
    truth_p = masses[picked] / masses.sum()
    raw = (n * truth_p) ** -0.4
    np.testing.assert_allclose(weights, raw / raw.max(), rtol=1e-12)
    assert weights.max() == 1.0
    assert np.argmin(weights) == np.argmax(probs)  # the likeliest pick weighs least


def test_prioritized_weights_stay_finite_with_a_large_beta() -> None:
    # (N·P)^-beta overflows here ((2e-6)^-400 is past float64), and the old ratio was NaN
    sampler = PrioritizedSampler(exponent=1.0, is_exponent=400.0)
    probs = np.array([0.999999, 1e-6, 0.999, 1e-6 * (1 + 2**-40)])
    weights = sampler.weights(probs, 2)
    assert np.all(np.isfinite(weights)) and weights.max() == 1.0
    expected = np.exp(-400.0 * (np.log(probs) - np.log(probs.min())))
    np.testing.assert_allclose(weights, expected, rtol=1e-9)


def test_a_probability_that_underflowed_to_zero_weighs_most() -> None:
    # priority 5e-324 of a total over 1: its probability rounds to 0.0
    sampler = PrioritizedSampler(exponent=1.0, is_exponent=0.4)
    np.testing.assert_array_equal(sampler.weights(np.array([0.5, 0.0, 0.25]), 3), [0, 1, 0])


def test_prioritized_weights_with_beta_zero_are_one() -> None:
    sampler = PrioritizedSampler(is_exponent=0.0)
    np.testing.assert_array_equal(sampler.weights(np.array([0.5, 0.1, 0.4]), 3), np.ones(3))


def test_other_samplers_weigh_one() -> None:
    sampler = PTimeSampler(half_life_s=1.0)
    np.testing.assert_array_equal(sampler.weights(np.array([0.5, 0.1]), 3), np.ones(2))


def test_ptime_probabilities_follow_age_exactly() -> None:
    rng = np.random.default_rng(13)
    n = 2000
    now = 1.7e9
    times = now - rng.uniform(0, 300, size=n)
    sampler = PTimeSampler(half_life_s=30.0)
    sampler.insert(np.arange(n), np.ones(n), times)
    masses = 2.0 ** (-(now - times) / 30.0)
    picked, probs = sampler.sample(3000, rng)
    np.testing.assert_allclose(probs, masses[picked] / masses.sum(), rtol=1e-9)


def test_ptime_rebases_over_thousands_of_half_lives() -> None:
    sampler = PTimeSampler(half_life_s=1.0)
    rng = np.random.default_rng(14)
    # Items arrive over 5,000 half-lives: without rebasing 2^5000 would overflow.
    for start in range(0, 5000, 250):
        times = np.array([start + 0.0, start + 0.5, start + 1.0])
        sampler.insert(np.arange(start // 250 * 3, start // 250 * 3 + 3), np.ones(3), times)
    picked, probs = sampler.sample(20_000, rng)
    assert np.all(np.isfinite(probs)) and np.all(probs > 0)
    # Only the last batch (times 4750, 4750.5, 4751) has any real weight left.
    newest = {57: 2.0**-1.0, 58: 2.0**-0.5, 59: 1.0}
    total = sum(newest.values())
    assert set(picked.tolist()) <= set(newest)
    for slot, prob in zip(picked.tolist(), probs.tolist(), strict=True):
        assert prob == pytest.approx(newest[slot] / total, rel=1e-9)


def test_ptime_recomputes_when_only_very_old_items_remain() -> None:
    sampler = PTimeSampler(half_life_s=1.0)
    sampler.insert(np.array([0, 1]), np.ones(2), np.array([0.0, 1.0]))
    sampler.insert(np.array([2]), np.ones(1), np.array([3000.0]))  # 0 and 1 underflow to 0
    sampler.remove(np.array([2]))
    picked, probs = sampler.sample(10_000, np.random.default_rng(15))
    assert set(picked.tolist()) == {0, 1}
    expected = {0: 1 / 3, 1: 2 / 3}
    for slot, prob in zip(picked.tolist(), probs.tolist(), strict=True):
        assert prob == pytest.approx(expected[slot], rel=1e-12)


def test_ptime_restarts_after_emptying() -> None:
    sampler = PTimeSampler(half_life_s=1.0)
    sampler.insert(np.array([0]), np.ones(1), np.array([1e6]))
    sampler.remove(np.array([0]))
    sampler.insert(np.array([0, 1]), np.ones(2), np.array([0.0, 1.0]))
    _, probs = sampler.sample(1, np.random.default_rng(0))
    assert probs[0] in (pytest.approx(1 / 3), pytest.approx(2 / 3))


@pytest.mark.parametrize("jump_nodes", [1, 4, 4096])
def test_sum_tree_total_and_search_match_cumulative_sums(jump_nodes: int) -> None:
    rng = np.random.default_rng(16)
    tree = SumTree(capacity=16, jump_nodes=jump_nodes)
    masses = np.zeros(1000)
    for _ in range(50):  # many small and large batched updates, growing as it goes
        k = int(rng.integers(1, 200))
        changed = rng.choice(1000, size=k, replace=False)
        values = np.where(rng.random(k) < 0.2, 0.0, rng.exponential(size=k))
        tree.set(changed.astype(np.int64), values)
        masses[changed] = values
    assert tree.total == pytest.approx(masses.sum(), rel=1e-12)
    targets = rng.random(10_000) * tree.total
    found = tree.find(targets)
    edges = np.cumsum(masses)
    truth = np.searchsorted(edges, targets, side="right")
    assert np.all(masses[found] > 0)
    # Away from interval edges (where rounding may decide), the search is the CDF inverse.
    clear = np.abs(edges[np.minimum(truth, 999)] - targets) > 1e-9
    np.testing.assert_array_equal(found[clear], truth[clear])


@pytest.mark.parametrize("jump_nodes", [1, 2, 4096])
def test_sum_tree_never_lands_on_zero_at_the_top_edge(jump_nodes: int) -> None:
    # Targets just below the total, where rounding in ``total - left`` can overshoot the
    # right subtree's sum and an unguarded walk would end on an empty leaf after the last.
    rng = np.random.default_rng(17)
    for _ in range(5000):
        tree = SumTree(capacity=16, jump_nodes=jump_nodes)
        k = int(rng.integers(2, 9))
        masses = rng.random(k) * rng.choice([1.0, 1e-3, 1e3], size=k)
        tree.set(np.arange(k), masses)
        top = np.nextafter(tree.total, 0.0)
        found = tree.find(np.array([top, np.nextafter(top, 0.0), 0.0]))
        assert np.all(found < k), (masses.tolist(), found)
