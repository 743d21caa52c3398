"""WindowBatch without a server: read from an answer, as torch tensors sharing its arrays'
memory, merged from shards' parts at their places; and the window options of ``sample``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlreplay.clients.episode_bodies import priorities_body, window_request, window_sample
from rlreplay.clients.windows import WindowBatch
from rlreplay.wire.errors import ReplayError, ValidationFailed


def answer(b: int = 3, w: int = 4, n_step: bool = True, offset: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(offset)
    out: dict[str, Any] = {
        "episodes": [f"ep-{offset + i}" for i in range(b)],
        "starts": np.arange(offset, offset + b, dtype=np.int64),
        "columns": {
            "obs": rng.integers(0, 255, (b, w, 2, 3), dtype=np.uint8),
            "reward": rng.random((b, w)).astype(np.float32),
        },
        "mask": np.ones((b, w), dtype=bool),
        "priorities": np.full(b, 1.0),
        "probabilities": np.full(b, 0.25),
        "weights": np.ones(b),
        "times_sampled": np.ones(b, dtype=np.int64),
    }
    if n_step:
        out["return"] = rng.random((b, w))
        out["discount"] = np.full((b, w), 0.99**3)
        out["next"] = {"obs": rng.integers(0, 255, (b, w, 2, 3), dtype=np.uint8)}
    return out


def test_a_batch_reads_its_answer() -> None:
    raw = answer()
    batch = WindowBatch.from_answer(raw)
    assert len(batch) == 3 and batch.window == 4
    assert batch["obs"] is raw["columns"]["obs"]
    assert batch.returns is raw["return"] and batch.discount is raw["discount"]
    assert batch.next["obs"] is raw["next"]["obs"]
    plain = WindowBatch.from_answer(answer(n_step=False))
    assert plain.returns is None and plain.discount is None and plain.next == {}
    with pytest.raises(ReplayError, match="malformed"):
        WindowBatch.from_answer({"episodes": []})


def test_as_torch_shares_the_arrays_memory() -> None:
    torch = pytest.importorskip("torch")
    batch = WindowBatch.from_answer(answer())
    tensors = batch.as_torch()
    assert tensors["obs"].shape == (3, 4, 2, 3) and tensors["obs"].dtype == torch.uint8
    assert tensors.mask.dtype == torch.bool
    pairs = [
        (tensors["obs"], batch["obs"]),
        (tensors["reward"], batch["reward"]),
        (tensors.mask, batch.mask),
        (tensors.weights, batch.weights),
        (tensors.returns, batch.returns),
        (tensors.next["obs"], batch.next["obs"]),
    ]
    for tensor, array in pairs:
        assert tensor is not None and array is not None
        assert tensor.data_ptr() == array.ctypes.data
    batch["reward"][0, 0] = 5.0
    assert float(tensors["reward"][0, 0]) == 5.0


def test_parts_merge_at_their_places() -> None:
    a = WindowBatch.from_answer(answer(b=2, offset=0))
    b = WindowBatch.from_answer(answer(b=3, offset=10))
    merged = WindowBatch.merged(
        [(a, np.array([1, 3], dtype=np.intp)), (b, np.array([0, 2, 4], dtype=np.intp))], 5
    )
    assert merged.episodes == ["ep-10", "ep-0", "ep-11", "ep-1", "ep-12"]
    assert merged.starts.tolist() == [10, 0, 11, 1, 12]
    np.testing.assert_array_equal(merged["obs"][[1, 3]], a["obs"])
    np.testing.assert_array_equal(merged["obs"][[0, 2, 4]], b["obs"])
    assert merged.returns is not None and b.returns is not None
    np.testing.assert_array_equal(merged.returns[[0, 2, 4]], b.returns)
    np.testing.assert_array_equal(merged.next["obs"][[1, 3]], a.next["obs"])
    other = answer(b=1, offset=20)
    other["columns"]["obs"] = other["columns"]["obs"].astype(np.int16)
    with pytest.raises(ValidationFailed, match="'obs'"):
        WindowBatch.merged(
            [(a, np.array([0, 1])), (WindowBatch.from_answer(other), np.array([2]))], 3
        )


def test_window_options_make_a_window_request() -> None:
    assert not window_sample({}, "items", True)
    assert window_sample({"length": 3}, "items", True)
    with pytest.raises(TypeError, match="layout"):
        window_sample({"length": 3}, "columns", True)
    body = window_request(8, None, {"length": 5, "n_step": 3, "next_fields": ("obs",)})
    assert (body.batch_size, body.length, body.n_step, body.next_fields) == (8, 5, 3, ["obs"])
    with pytest.raises(TypeError, match="lenght"):
        window_request(8, None, {"lenght": 5})  # type: ignore[typeddict-unknown-key]


def test_priorities_take_values_or_td_errors() -> None:
    body = priorities_body([("a", 0, 2.0), ("b", 4, np.float32(0.5))], None)
    entries = [(w.episode, w.start, w.priority) for w in body.windows]
    assert entries == [("a", 0, 2.0), ("b", 4, 0.5)]
    body = priorities_body([("a", 2, np.array([0.5, -1.0]))], 0.9)
    assert body.eta == 0.9 and body.windows[0].td == [0.5, 1.0]
    with pytest.raises(ValidationFailed, match="windows\\[0\\]"):
        priorities_body([("a", 1)], None)  # type: ignore[list-item]
