"""n-step ``return``, ``discount`` and ``next`` equal a loop over the contract's words, for n
in 1..5 around terminated, truncated and still-open episode ends."""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay.app.episodes.nstep import nstep_targets
from rlreplay.app.episodes.window_starts import OPEN, TERMINATED, TRUNCATED, WindowShape
from rlreplay.app.episodes.windows import WindowRequest, build_windows

from .window_model import SCHEMA, Store, chunk_reads_ok, garbage, make_episode, reference_window


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("end_kind", [TERMINATED, TRUNCATED, OPEN])
@pytest.mark.parametrize("final", [True, False])
@pytest.mark.parametrize(("w", "chunk_steps"), [(1, 0), (4, 0), (1, 2), (4, 3)])
def test_nstep_targets_equal_the_reference(
    n: int, end_kind: int, final: bool, w: int, chunk_steps: int
) -> None:
    rng = np.random.default_rng(n * 100 + end_kind * 10 + w)
    store = Store(
        [make_episode(rng, i, length, end_kind, final) for i, length in enumerate([1, 3, 8, 13])]
    )
    stack = {"frame": 3}
    next_fields = ("obs", "frame", "action")
    gamma = 0.93
    request = WindowRequest(
        WindowShape(length=w, pad=True, n_step=n), ("reward",), stack, gamma, "reward", next_fields
    )
    pairs = []
    for e, ep in enumerate(store.episodes):
        for s in range(ep.length):
            # an open episode's window is drawn only when t + n is stored for its steps
            if end_kind == OPEN and s + w + n > ep.length:
                continue
            pairs.append((e, s))
    if not pairs:
        return
    eps = [store.episodes[e] for e, _ in pairs]
    got = build_windows(
        episodes=np.asarray([e for e, _ in pairs], dtype=np.int64),
        starts=np.asarray([s for _, s in pairs], dtype=np.int64),
        lengths=np.asarray([ep.length for ep in eps], dtype=np.int64),
        end_kinds=np.asarray([ep.end_kind for ep in eps], dtype=np.int8),
        finals=[ep.final for ep in eps],
        request=request,
        schema=SCHEMA,
        read_steps=store.read,
        chunk_steps=chunk_steps,
        alloc=garbage,
    )
    assert got.targets is not None and got.next is not None
    for b, (e, s) in enumerate(pairs):
        want = reference_window(store.episodes[e], s, w, ("reward",), stack, n, gamma, next_fields)
        # bit for bit: the same sums in the same order
        np.testing.assert_array_equal(got.targets.returns[b], want["return"])
        np.testing.assert_array_equal(got.targets.discounts[b], want["discount"])
        for name in next_fields:
            np.testing.assert_array_equal(got.next[name][b], want["next"][name], err_msg=name)
    chunk_reads_ok(store, chunk_steps)
    if not chunk_steps:
        assert len(store.reads) == len(pairs)  # one read per window, next values included


def test_terminal_and_truncated_ends_by_hand() -> None:
    # rewards 1, 2, 4 over 3 steps; n = 2, gamma = 0.5
    rewards = np.asarray([[1.0, 2.0, 4.0, 0.0]])
    for kind, last_discount in ((TERMINATED, 0.0), (TRUNCATED, 0.5)):
        got = nstep_targets(
            starts=np.asarray([0]),
            lengths=np.asarray([3]),
            end_kinds=np.asarray([kind]),
            rewards=rewards,
            steps=3,
            n=2,
            gamma=0.5,
        )
        np.testing.assert_array_equal(got.returns[0], [1 + 0.5 * 2, 2 + 0.5 * 4, 4])
        # t = 1: t + n' = 3 = L, so a terminated episode does not bootstrap
        expected = [0.25, 0.0 if kind == TERMINATED else 0.25, last_discount]
        np.testing.assert_array_equal(got.discounts[0], expected)
        np.testing.assert_array_equal(got.next_steps[0], [2, 3, 3])


def test_padded_steps_have_no_return_and_no_discount() -> None:
    got = nstep_targets(
        starts=np.asarray([1]),
        lengths=np.asarray([2]),
        end_kinds=np.asarray([TRUNCATED]),
        rewards=np.asarray([[3.0, 0.0, 0.0, 0.0]]),
        steps=3,
        n=2,
        gamma=0.9,
    )
    np.testing.assert_array_equal(got.returns[0], [3.0, 0.0, 0.0])
    np.testing.assert_array_equal(got.discounts[0], [0.9, 0.0, 0.0])
    np.testing.assert_array_equal(got.next_steps[0], [2, -1, -1])
