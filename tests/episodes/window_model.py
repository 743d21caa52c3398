"""A plain model of an episode table's steps, and reference windows built with loops.

The tests of windows, n-step returns and window sampling compare what the server's
vectorised code builds with what these loops build step by step, straight from the
contract's words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlreplay.app.episodes.fields import FieldSpec
from rlreplay.app.episodes.window_starts import OPEN, TERMINATED

OBS_SHAPE = (3, 2)


@dataclass
class Episode:
    """One episode: its steps by field, how it ended, its final values."""

    steps: dict[str, np.ndarray]
    end_kind: int = OPEN
    final: dict[str, np.ndarray] | None = None

    @property
    def length(self) -> int:
        return len(next(iter(self.steps.values())))


@dataclass
class Store:
    """Episodes by index, and a record of every read the builder made."""

    episodes: list[Episode]
    reads: list[tuple[int, int, int, tuple[str, ...]]] = field(default_factory=list)

    def read(self, episode: int, start: int, stop: int, fields: Sequence[str]) -> dict[str, Any]:
        assert 0 <= start <= stop <= self.episodes[episode].length, (episode, start, stop)
        self.reads.append((episode, start, stop, tuple(fields)))
        steps = self.episodes[episode].steps
        return {f: steps[f][start:stop].copy() for f in fields}


SCHEMA = {
    "obs": FieldSpec.of("obs", "<f4", OBS_SHAPE),
    "frame": FieldSpec.of("frame", "|u1", (2, 2)),
    "action": FieldSpec.of("action", "<i8", ()),
    "reward": FieldSpec.of("reward", "<f8", ()),
}


def make_episode(
    rng: np.random.Generator, ident: int, length: int, end_kind: int, final: bool
) -> Episode:
    """Steps whose values say which episode and step they are (so a mix-up shows)."""
    steps = {
        "obs": (ident * 1000 + np.arange(length, dtype=np.float32))[:, None, None]
        + np.zeros((1, *OBS_SHAPE), dtype=np.float32),
        "frame": rng.integers(0, 255, size=(length, 2, 2), dtype=np.uint8),
        "action": np.arange(length, dtype=np.int64) + ident * 100,
        "reward": rng.normal(size=length),
    }
    finals = None
    if final:
        finals = {
            "obs": np.full(OBS_SHAPE, -float(ident), dtype=np.float32),
            "frame": rng.integers(0, 255, size=(2, 2), dtype=np.uint8),
            "action": np.asarray(-ident, dtype=np.int64),
            "reward": np.asarray(0.0),
        }
    return Episode(steps, end_kind, finals)


def value_at(ep: Episode, name: str, step: int, k: int) -> np.ndarray:
    """The value of ``name`` at ``step`` (the final at the episode's length, zeros when it
    has none), stacked over the last ``k`` frames when ``k`` > 0."""
    spec = SCHEMA[name]
    if step == ep.length:
        last = None if ep.final is None else ep.final.get(name)
        if last is None:
            return np.zeros(((k,) if k else ()) + spec.shape, dtype=spec.np_dtype)

    def one(u: int) -> np.ndarray:
        if u == ep.length:
            assert ep.final is not None
            return ep.final[name]
        return ep.steps[name][max(u, 0)]

    if not k:
        return one(step)
    return np.stack([one(step - k + 1 + j) for j in range(k)])


def reference_window(
    ep: Episode,
    start: int,
    w: int,
    fields: Sequence[str],
    frame_stack: Mapping[str, int],
    n: int = 0,
    gamma: float = 0.99,
    next_fields: Sequence[str] = (),
) -> dict[str, Any]:
    """One window, step by step, as the contract words it."""
    L = ep.length
    out: dict[str, Any] = {"mask": np.zeros(w, dtype=bool), "columns": {}, "next": {}}
    for name in fields:
        spec, k = SCHEMA[name], frame_stack.get(name, 0)
        out["columns"][name] = np.zeros((w, *((k,) if k else ()), *spec.shape), spec.np_dtype)
    for name in next_fields:
        spec, k = SCHEMA[name], frame_stack.get(name, 0)
        out["next"][name] = np.zeros((w, *((k,) if k else ()), *spec.shape), spec.np_dtype)
    returns, discounts = np.zeros(w), np.zeros(w)
    for i in range(w):
        t = start + i
        if t >= L:
            continue  # padded: zeros, mask false, return 0, discount 0
        out["mask"][i] = True
        for name in fields:
            out["columns"][name][i] = value_at(ep, name, t, frame_stack.get(name, 0))
        if not n:
            continue
        n_prime = min(n, L - t) if ep.end_kind != OPEN else n
        total = 0.0
        for j in range(n_prime):
            total += gamma**j * float(ep.steps["reward"][t + j])
        returns[i] = total
        if ep.end_kind == TERMINATED and t + n_prime == L:
            discounts[i] = 0.0
        else:
            discounts[i] = gamma**n_prime
        for name in next_fields:
            out["next"][name][i] = value_at(ep, name, t + n_prime, frame_stack.get(name, 0))
    out["return"], out["discount"] = returns, discounts
    return out


def garbage(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """An array full of bytes that are no value written (as a reused buffer is): every
    element of the batch must be written, zeros included."""
    out = np.empty(shape, dtype=dtype)
    out.view(np.uint8).reshape(-1)[:] = 0xA5
    return out


def chunk_reads_ok(store: Store, chunk_steps: int) -> None:
    """Each read lies within one chunk of ``chunk_steps`` steps (0: any range)."""
    if chunk_steps:
        for _, lo, hi, _ in store.reads:
            assert lo // chunk_steps == (hi - 1) // chunk_steps, (lo, hi)
