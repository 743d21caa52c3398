"""Window starts: which steps are eligible, and the table's sampler among them (frequencies by
chi-square with fixed seeds, probabilities and importance weights exactly)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from rlreplay.app.episodes.start_sampling import StartSampler
from rlreplay.app.episodes.window_starts import (
    OPEN,
    TERMINATED,
    TRUNCATED,
    WindowShape,
    eligible_starts,
)

DRAWS = 200_000
P_MIN = 1e-4


def columns(lengths: list[int], kinds: list[int], seed: int = 0) -> dict[str, np.ndarray]:
    """Per-step columns of episodes of ``lengths`` whose steps are interleaved in slot
    order (as many writers leave them), with a few freed slots among them."""
    rng = np.random.default_rng(seed)
    pairs = [(e, t) for e, length in enumerate(lengths) for t in range(length)]
    order = rng.permutation(len(pairs))
    n = len(pairs) + 5
    live = np.zeros(n, dtype=bool)
    episode_of = np.full(n, 99, dtype=np.int64)  # a freed slot's stale values
    step_of = np.zeros(n, dtype=np.int64)
    holes = set(rng.choice(n, size=5, replace=False).tolist())
    free = [s for s in range(n) if s not in holes]
    for slot, i in zip(free, order.tolist(), strict=False):
        live[slot] = True
        episode_of[slot], step_of[slot] = pairs[i]
    return {
        "live": live,
        "episode_of": np.where(live, episode_of, 0),
        "step_of": step_of,
        "length": np.asarray(lengths, dtype=np.int64),
        "end_kind": np.asarray(kinds, dtype=np.int8),
        "seq": rng.permutation(n).astype(np.int64),
        "priority": rng.uniform(0.0, 4.0, size=n),
    }


def reference_eligible(c: dict[str, np.ndarray], shape: WindowShape) -> list[int]:
    out = []
    for slot in range(len(c["live"])):
        if not c["live"][slot]:
            continue
        e, t = int(c["episode_of"][slot]), int(c["step_of"][slot])
        length, kind = int(c["length"][e]), int(c["end_kind"][e])
        if t % shape.start_every:
            continue
        if not shape.pad and t + shape.steps > length:
            continue
        if shape.n_step and kind == OPEN:
            # every step t' of the window has t' + n stored (padding or not)
            if any(u + shape.n_step >= length for u in range(t, min(t + shape.steps, length))):
                continue
            if t + shape.steps > length:
                continue
        out.append(slot)
    return out


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("n_step", [0, 1, 3])
@pytest.mark.parametrize(("length", "burn_in", "start_every"), [(1, 0, 1), (3, 2, 1), (2, 2, 4)])
def test_eligible_starts_equal_the_reference(
    pad: bool, n_step: int, length: int, burn_in: int, start_every: int
) -> None:
    c = columns([1, 4, 9, 13, 6, 2], [OPEN, TERMINATED, TRUNCATED, OPEN, TERMINATED, OPEN])
    shape = WindowShape(length, burn_in, start_every, pad, n_step)
    got = eligible_starts(
        shape,
        live=c["live"],
        episode_of=c["episode_of"],
        step_of=c["step_of"],
        length=c["length"],
        end_kind=c["end_kind"],
    )
    assert got.tolist() == reference_eligible(c, shape)


def test_max_times_sampled_retires_starts() -> None:
    c = columns([4], [TERMINATED])
    times = np.zeros(len(c["live"]), dtype=np.int64)
    times[c["live"]] = [0, 2, 1, 2]
    kw = {k: c[k] for k in ("live", "episode_of", "step_of", "length", "end_kind")}
    got = eligible_starts(WindowShape(), times_sampled=times, max_times_sampled=2, **kw)
    live_slots = np.flatnonzero(c["live"])
    assert got.tolist() == live_slots[[0, 2]].tolist()


def assert_follows(
    sampler: StartSampler,
    eligible: np.ndarray,
    c: dict[str, np.ndarray],
    want: np.ndarray,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    lookup = {s: i for i, s in enumerate(eligible.tolist())}
    observed = np.zeros(len(eligible))
    for _ in range(DRAWS // 1000):
        drawn = sampler.draw(1000, rng, eligible=eligible, priority=c["priority"], seq=c["seq"])
        index = np.asarray([lookup[s] for s in drawn.slots.tolist()])
        np.testing.assert_allclose(drawn.probabilities, want[index], rtol=1e-12)
        observed += np.bincount(index, minlength=len(eligible))
    p_value = chisquare(observed, want * DRAWS).pvalue
    assert p_value > P_MIN, f"p = {p_value:.3g}"


def test_uniform_over_window_starts() -> None:
    c = columns([3, 8, 5], [TERMINATED, OPEN, TRUNCATED], seed=1)
    kw = {k: c[k] for k in ("live", "episode_of", "step_of", "length", "end_kind")}
    eligible = eligible_starts(WindowShape(length=3), **kw)
    assert len(eligible) == 1 + 6 + 3
    sampler = StartSampler("uniform", {})
    assert_follows(sampler, eligible, c, np.full(len(eligible), 1 / len(eligible)), seed=2)
    drawn = sampler.draw(
        10, np.random.default_rng(0), eligible=eligible, priority=c["priority"], seq=c["seq"]
    )
    assert drawn.weights.tolist() == [1.0] * 10 and drawn.size == len(eligible)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_prioritized_over_window_starts_and_weights_exactly(alpha: float) -> None:
    c = columns([6, 9, 4], [TERMINATED, OPEN, TRUNCATED], seed=3)
    kw = {k: c[k] for k in ("live", "episode_of", "step_of", "length", "end_kind")}
    eligible = eligible_starts(WindowShape(length=2, start_every=2), **kw)
    c["priority"][eligible[:2]] = 0.0  # starts of priority 0: never drawn
    pri = c["priority"][eligible]
    masses = np.where(pri > 0, pri**alpha if alpha else 1.0, 0.0)
    want = masses / masses.sum()
    sampler = StartSampler("prioritized", {"exponent": alpha, "is_exponent": 0.7})
    keep = want > 0
    assert_follows(sampler, eligible[keep], c, want[keep] / want[keep].sum(), seed=4)
    drawn = sampler.draw(
        64, np.random.default_rng(5), eligible=eligible, priority=c["priority"], seq=c["seq"]
    )
    # the items' weights: (N·P(i))^-beta over the batch's largest, N the eligible starts
    raw = (len(eligible) * drawn.probabilities) ** -0.7
    np.testing.assert_allclose(drawn.weights, raw / raw.max(), rtol=1e-12)
    assert set(drawn.slots.tolist()) <= set(eligible[keep].tolist())


def test_prioritized_with_every_priority_zero_is_uniform() -> None:
    c = columns([5], [TERMINATED], seed=6)
    c["priority"][:] = 0.0
    eligible = np.flatnonzero(c["live"])
    drawn = StartSampler("prioritized", {}).draw(
        50, np.random.default_rng(0), eligible=eligible, priority=c["priority"], seq=c["seq"]
    )
    assert drawn.probabilities.tolist() == [1 / 5] * 50 and drawn.weights.tolist() == [1.0] * 50


@pytest.mark.parametrize(
    ("kind", "pick"),
    [
        ("fifo", lambda c, e: e[np.argmin(c["seq"][e])]),
        ("lifo", lambda c, e: e[np.argmax(c["seq"][e])]),
        ("max_heap", lambda c, e: e[np.argmax(c["priority"][e])]),
        ("min_heap", lambda c, e: e[np.argmin(c["priority"][e])]),
    ],
)
def test_deterministic_samplers_name_one_start(kind: str, pick) -> None:  # type: ignore[no-untyped-def]
    c = columns([7, 3], [TERMINATED, OPEN], seed=7)
    eligible = np.flatnonzero(c["live"])
    drawn = StartSampler(kind, {}).draw(
        4, np.random.default_rng(0), eligible=eligible, priority=c["priority"], seq=c["seq"]
    )
    assert drawn.slots.tolist() == [pick(c, eligible)] * 4
    assert drawn.probabilities.tolist() == [1.0] * 4 and drawn.weights.tolist() == [1.0] * 4


def test_fifo_with_max_times_sampled_is_a_queue_of_starts() -> None:
    c = columns([6], [TERMINATED], seed=8)
    eligible = np.flatnonzero(c["live"])
    times = np.zeros(len(c["live"]), dtype=np.int64)
    drawn = StartSampler("fifo", {}).draw(
        4, np.random.default_rng(0), eligible=eligible, priority=c["priority"], seq=c["seq"],
        times_sampled=times, max_times_sampled=1,
    )  # fmt: skip
    assert drawn.slots.tolist() == eligible[np.argsort(c["seq"][eligible])][:4].tolist()


def test_uniform_with_max_times_sampled_draws_each_start_once() -> None:
    c = columns([6], [TERMINATED], seed=9)
    eligible = np.flatnonzero(c["live"])
    times = np.zeros(len(c["live"]), dtype=np.int64)
    drawn = StartSampler("uniform", {}).draw(
        10, np.random.default_rng(0), eligible=eligible, priority=c["priority"], seq=c["seq"],
        times_sampled=times, max_times_sampled=1,
    )  # fmt: skip
    assert sorted(drawn.slots.tolist()) == sorted(eligible.tolist())  # 6 of the 10 asked
    # each pick's probability is over the starts left when it was drawn
    assert drawn.probabilities.tolist() == [1 / 6, 1 / 5, 1 / 4, 1 / 3, 1 / 2, 1.0]


def test_samplers_that_do_not_apply_are_refused() -> None:
    with pytest.raises(ValueError, match="'ptime' does not apply to episode tables"):
        StartSampler("ptime", {})
    with pytest.raises(ValueError, match="exponent"):
        StartSampler("prioritized", {"exponent": -1})
