"""Short windows gathered field by field equal the window build's, bit for bit: values,
masks, frame stacks, padding, n-step targets and ``next`` around every kind of episode end;
each chunk is read once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlreplay.app.episodes import window_gather
from rlreplay.app.episodes.window_gather import WindowGather
from rlreplay.app.episodes.window_starts import OPEN, TERMINATED, TRUNCATED, WindowShape
from rlreplay.app.episodes.windows import (
    WindowBatch,
    WindowRequest,
    WindowSlices,
    build_windows,
)

from .window_model import SCHEMA, Store, chunk_reads_ok, garbage, make_episode


def store_of(seed: int, lengths: list[int]) -> Store:
    rng = np.random.default_rng(seed)
    kinds = [OPEN, TERMINATED, TRUNCATED]
    return Store(
        [
            make_episode(rng, i, length, kinds[i % 3], final=i % 4 < 2)
            for i, length in enumerate(lengths)
        ]
    )


def both(
    store: Store,
    pairs: list[tuple[int, int]],
    request: WindowRequest,
    chunk_steps: int,
    sliced: tuple[str, ...] = (),
) -> tuple[WindowBatch, WindowBatch]:
    eps = [store.episodes[e] for e, _ in pairs]
    args: dict[str, Any] = {
        "episodes": np.asarray([e for e, _ in pairs], dtype=np.int64),
        "starts": np.asarray([s for _, s in pairs], dtype=np.int64),
        "lengths": np.asarray([ep.length for ep in eps], dtype=np.int64),
        "end_kinds": np.asarray([ep.end_kind for ep in eps], dtype=np.int8),
        "finals": [ep.final for ep in eps],
        "request": request,
        "schema": SCHEMA,
        "alloc": garbage,
    }
    want = build_windows(read_steps=store.read, chunk_steps=chunk_steps, **args)
    store.reads.clear()
    gather = WindowGather(chunk_steps=chunk_steps, sliced=sliced, **args)
    gather.read(store.read)
    got = gather.fill()
    for part in (got.columns, got.next or {}):  # a plain field named: slices, else copied
        for name, values in part.items():
            plain = not request.stack(name)
            assert (type(values) is WindowSlices) == (name in sliced and plain), name
    chunk_reads_ok(store, chunk_steps)
    assert len(store.reads) == len({(e, lo) for e, lo, _, _ in store.reads})  # each chunk once
    return want, got


def same(want: WindowBatch, got: WindowBatch) -> None:
    np.testing.assert_array_equal(got.mask, want.mask)
    for part in ("columns", "next"):
        a, b = getattr(want, part) or {}, getattr(got, part) or {}
        assert a.keys() == b.keys()
        for name in a:
            assert b[name].dtype == a[name].dtype and b[name].shape == a[name].shape
            np.testing.assert_array_equal(b[name], a[name], err_msg=f"{part} {name}")
    if want.targets is None:
        assert got.targets is None
        return
    assert got.targets is not None
    np.testing.assert_array_equal(got.targets.returns, want.targets.returns)
    np.testing.assert_array_equal(got.targets.discounts, want.targets.discounts)
    np.testing.assert_array_equal(got.targets.next_steps, want.targets.next_steps)


@pytest.mark.parametrize("n", [0, 1, 3, 5])
@pytest.mark.parametrize("w", [1, 2, 6])
@pytest.mark.parametrize("stack", [{}, {"frame": 1}, {"frame": 3, "obs": 2}])
@pytest.mark.parametrize("chunk_steps", [1, 2, 3, 8])
@pytest.mark.parametrize("how", ["arena", "by chunk", "sliced"])
def test_gathered_windows_equal_the_built_ones(
    n: int,
    w: int,
    stack: dict[str, int],
    chunk_steps: int,
    how: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if how == "by chunk":  # every field gathered chunk by chunk, as frames are
        monkeypatch.setattr(window_gather, "ARENA_BYTES", 0)
    sliced = ("obs", "frame", "action") if how == "sliced" else ()
    store = store_of(n * 7 + w, [1, 2, 5, 9, 12, 17])
    fields = ("obs", "frame", "action")
    next_fields = ("obs", "frame", "action") if n else ()
    request = WindowRequest(
        WindowShape(length=w, pad=True, n_step=n), fields, stack, 0.91, "reward", next_fields
    )
    pairs = [
        (e, s)
        for e, ep in enumerate(store.episodes)
        for s in range(ep.length)
        # an open episode's window is drawn only when t + n is stored for its steps
        if not (n and ep.end_kind == OPEN and s + w + n > ep.length)
    ]
    rng = np.random.default_rng(w)
    pairs = [pairs[i] for i in rng.permutation(len(pairs))] + pairs[:3]  # any order, repeats
    same(*both(store, pairs, request, chunk_steps, sliced))


def test_one_window_gathers_like_a_batch() -> None:
    store = store_of(3, [5, 40, 40])  # open, terminated (with final), truncated
    request = WindowRequest(
        WindowShape(length=1, n_step=3), ("obs",), {"obs": 4}, 0.99, "reward", ("obs",)
    )
    for pair in [(1, 39), (1, 0), (2, 38)]:
        same(*both(store, [pair], request, 16))
        same(*both(store, [pair], request, 16, ("obs",)))
