"""Windows of an episode's steps: the values bit for bit, masks, frame stacks, one read each."""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay.app.episodes.window_starts import OPEN, TERMINATED, TRUNCATED, WindowShape
from rlreplay.app.episodes.windows import (
    WindowRequest,
    WindowSlices,
    answer_bytes,
    build_windows,
)
from rlreplay.wire.errors import ValidationFailed

from .window_model import (
    SCHEMA,
    Store,
    chunk_reads_ok,
    garbage,
    make_episode,
    reference_window,
)


def store_of(seed: int, lengths: list[int]) -> Store:
    rng = np.random.default_rng(seed)
    kinds = [OPEN, TERMINATED, TRUNCATED]
    return Store(
        [
            make_episode(rng, i, length, kinds[i % 3], final=i % 2 == 0)
            for i, length in enumerate(lengths)
        ]
    )


def build(
    store: Store,
    pairs: list[tuple[int, int]],
    request: WindowRequest,
    chunk_steps: int = 0,
    sliced: tuple[str, ...] = (),
):  # type: ignore[no-untyped-def]
    episodes = np.asarray([e for e, _ in pairs], dtype=np.int64)
    eps = [store.episodes[e] for e, _ in pairs]
    return build_windows(
        episodes=episodes,
        starts=np.asarray([s for _, s in pairs], dtype=np.int64),
        lengths=np.asarray([ep.length for ep in eps], dtype=np.int64),
        end_kinds=np.asarray([ep.end_kind for ep in eps], dtype=np.int8),
        finals=[ep.final for ep in eps],
        request=request,
        schema=SCHEMA,
        read_steps=store.read,
        chunk_steps=chunk_steps,
        alloc=garbage,
        sliced=sliced,
    )


@pytest.mark.parametrize("w", [1, 3, 7])
@pytest.mark.parametrize("stack", [{}, {"frame": 1}, {"frame": 4, "obs": 2}])
@pytest.mark.parametrize("chunk_steps", [0, 2, 3])
@pytest.mark.parametrize("sliced", [(), ("obs", "frame", "action")])
def test_windows_equal_the_steps_with_masks_and_stacks(
    w: int, stack: dict[str, int], chunk_steps: int, sliced: tuple[str, ...]
) -> None:
    store = store_of(1, [1, 2, 5, 9, 12])
    fields = ("obs", "frame", "action")
    request = WindowRequest(WindowShape(length=w, pad=True), fields, stack)
    pairs = [(e, s) for e, ep in enumerate(store.episodes) for s in range(ep.length)]
    got = build(store, pairs, request, chunk_steps, sliced)
    for name in fields:  # a plain field named is left as slices, a stacked one copied
        assert (type(got.columns[name]) is WindowSlices) == (name in sliced and name not in stack)
    assert list(got.columns) == list(fields)
    assert got.mask.shape == (len(pairs), w)
    for b, (e, s) in enumerate(pairs):
        want = reference_window(store.episodes[e], s, w, fields, stack)
        np.testing.assert_array_equal(got.mask[b], want["mask"])
        for name in fields:
            k = stack.get(name, 0)
            spec = SCHEMA[name]
            assert got.columns[name].shape == (len(pairs), w, *((k,) if k else ()), *spec.shape)
            assert got.columns[name].dtype == spec.np_dtype
            np.testing.assert_array_equal(got.columns[name][b], want["columns"][name])
    # per window, reads of W + k - 1 steps at most, one per chunk, never past its episode
    chunk_reads_ok(store, chunk_steps)
    k = max(stack.values(), default=1)

    reads = iter(store.reads)
    for e, s in pairs:
        lo = max(0, s - k + 1)
        hi = min(store.episodes[e].length, s + w)
        at = lo
        while at < hi:  # contiguous reads cover [lo, hi) exactly
            e2, a, z, _ = next(reads)
            assert (e2, a) == (e, at)
            at = z
        assert at == hi
    assert next(reads, None) is None


def test_a_window_never_crosses_into_the_next_episode() -> None:
    store = store_of(2, [4, 4])
    request = WindowRequest(WindowShape(length=6, pad=True), ("action",))
    got = build(store, [(0, 2)], request)
    # steps 2, 3 of episode 0, then padding (episode 1's actions are 100..103)
    np.testing.assert_array_equal(got.columns["action"][0], [2, 3, 0, 0, 0, 0])
    np.testing.assert_array_equal(got.mask[0], [True, True, False, False, False, False])


def test_frame_stack_repeats_the_first_frame_before_the_start() -> None:
    store = store_of(3, [3])
    frames = store.episodes[0].steps["frame"]
    request = WindowRequest(WindowShape(length=3), ("frame",), {"frame": 4})
    got = build(store, [(0, 0)], request).columns["frame"][0]
    assert got.shape == (3, 4, 2, 2)
    np.testing.assert_array_equal(got[0], frames[[0, 0, 0, 0]])
    np.testing.assert_array_equal(got[1], frames[[0, 0, 0, 1]])
    np.testing.assert_array_equal(got[2], frames[[0, 0, 1, 2]])


def test_fields_are_checked_against_the_table() -> None:
    shape = WindowShape(length=2)
    with pytest.raises(ValidationFailed, match="'nope'"):
        WindowRequest(shape, ("nope",)).check(SCHEMA)
    with pytest.raises(ValidationFailed, match="needs n_step"):
        WindowRequest(shape, ("obs",), next_fields=("obs",)).check(SCHEMA)
    with pytest.raises(ValidationFailed, match="reward_field 'obs'"):
        WindowRequest(WindowShape(n_step=2), ("obs",), reward_field="obs").check(SCHEMA)
    with pytest.raises(ValidationFailed, match="gamma"):
        WindowRequest(WindowShape(n_step=2), ("obs",), gamma=1.5).check(SCHEMA)
    WindowRequest(WindowShape(n_step=2), ("obs",), next_fields=("obs",)).check(SCHEMA)


def test_window_shape_names_a_bad_number() -> None:
    with pytest.raises(ValueError, match=r"length \(0\)"):
        WindowShape(length=0)
    with pytest.raises(ValueError, match=r"start_every \(0\)"):
        WindowShape(start_every=0)


def test_answer_bytes_counts_stacked_frames() -> None:
    plain = WindowRequest(WindowShape(length=10), ("frame",))
    stacked = WindowRequest(WindowShape(length=10), ("frame",), {"frame": 4})
    assert answer_bytes(8, stacked, SCHEMA) - answer_bytes(8, plain, SCHEMA) == 8 * 10 * 3 * 4
