"""Draws among the items a ``where`` filter matched (a sample with ``where``).

The table's sampler draws among every item; a filtered sample draws among the matched
ones as that sampler would if they were all the table held: ``uniform`` (and samplers
without a rule of their own here) uniformly, ``prioritized`` in proportion to
``priority ** exponent``, ``fifo`` and ``lifo`` the oldest and newest, ``max_heap`` and
``min_heap`` the highest and lowest priority, ``ptime`` by ``2 ** (-age / half_life_s)``.
It counts ``times_sampled`` and retires items ``max_times_sampled`` uses up as
:func:`~rlreplay.app.tables.draws.draw` does, and answers the same :class:`Draw`, so
:meth:`Table.undraw` takes it back.

Like the other draw functions these are the table's own and change its private columns.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from rlreplay.app.tables.draws import Draw

if TYPE_CHECKING:
    from rlreplay.app.tables.table import Table

__all__ = ["draw_among", "selectable"]


def selectable(table: Table, among: set[int]) -> np.ndarray:
    """The slots of ``among`` the sampler may draw now (live, not retired), sorted."""
    if not among:
        return np.empty(0, dtype=np.int64)
    slots = np.fromiter(among, dtype=np.int64, count=len(among))
    keys, retired = table._keys, table._retired
    keep = [s for s in slots.tolist() if keys[s] is not None and not retired[s]]
    return np.sort(np.asarray(keep, dtype=np.int64))


def _probabilities(table: Table, slots: np.ndarray) -> np.ndarray:
    kind, params = table.config.sampler.type, table.config.sampler.params
    n = len(slots)
    if kind in ("fifo", "lifo", "max_heap", "min_heap"):
        key: Any = table._order[slots] if kind in ("fifo", "lifo") else table._priority[slots]
        pick = int(np.argmin(key)) if kind in ("fifo", "min_heap") else int(np.argmax(key))
        probs = np.zeros(n)
        probs[pick] = 1.0
        return probs
    if kind == "prioritized":
        mass = table._priority[slots] ** float(params.get("exponent", 0.6))
    elif kind == "ptime":
        age = time.time() - table._inserted_at[slots]
        mass = np.exp2(-age / float(params.get("half_life_s", 60.0)))
    else:
        mass = np.ones(n)
    total = float(mass.sum())
    return np.full(n, 1.0 / n) if total <= 0 else mass / total


def draw_among(table: Table, n: int, rng: np.random.Generator, slots: np.ndarray) -> Draw:
    """Draw ``n`` picks among ``slots`` (from :func:`selectable`, not empty)."""
    t = table
    mts = t.config.max_times_sampled
    got: list[int] = []
    got_probs: list[float] = []
    exhausted: list[str] = []
    places: list[tuple[Any, Any]] = []
    while len(got) < n and len(slots):
        probs = _probabilities(t, slots)
        picks = rng.choice(len(slots), size=n - len(got), p=probs)
        for i in picks.tolist():
            slot = int(slots[i])
            t._times_sampled[slot] += 1
            t._meta_dirty[slot] = 1
            got.append(slot)
            got_probs.append(float(probs[i]))
            if mts and t._times_sampled[slot] >= mts:
                one = np.asarray([slot], dtype=np.int64)
                key = t._keys[slot]
                assert key is not None
                places.append(
                    (t.sampler.place(one), None if t.remover is None else t.remover.place(one))
                )
                t.unselect(one, remover=True)
                exhausted.append(key)
                slots = slots[slots != slot]
                break  # the rest are drawn among what is left
    return Draw(np.asarray(got, dtype=np.int64), np.asarray(got_probs), exhausted, places)
