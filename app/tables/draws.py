"""Draws from a table's sampler, as Reverb makes them, and taking one back.

A draw counts ``times_sampled`` and takes the items that ``max_times_sampled`` uses up out
of selection (``retired``) as it goes, so a later pick of the same draw never sees them. A
sample refused after its draw (an answer too big, values that do not stack, a disk read
past the deadline) consumes nothing: :func:`undraw` gives the counts back and holds the
retired items again in the very places they had in the sampler's and remover's order, so
a FIFO queue or a heap hands them out next as if the refused sample never happened.

Callers go through :meth:`Table.draw` and :meth:`Table.undraw`: these functions are the
table's own, kept apart for their length, and change its private columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from rlreplay.app.tables.table import Table

__all__ = ["Draw", "draw", "undraw"]


class Draw(NamedTuple):
    """What :func:`draw` picked, and what :func:`undraw` needs to take it back."""

    slots: np.ndarray
    probabilities: np.ndarray
    #: The keys of the items the draw used up, in the order it retired them.
    exhausted: list[str]
    #: Where each of them stood: (the sampler's place, the remover's or None).
    places: list[tuple[Any, Any]]


def draw(table: Table, n: int, rng: np.random.Generator) -> Draw:
    """Draw ``n`` picks from ``table``, one after another, each seeing the previous ones'
    effect, so a retired item is never handed out again (vectorised while nothing
    retires)."""
    t = table
    mts = t.config.max_times_sampled
    if mts == 0:
        slots, probs = t.sampler.sample(n, rng)
        np.add.at(t._times_sampled, slots, 1)
        t._meta_dirty[slots] = 1
        return Draw(slots, probs, [], [])
    got_slots: list[int] = []
    got_probs: list[float] = []
    exhausted: list[str] = []
    places: list[tuple[Any, Any]] = []
    sampler, remover = t.sampler, t.remover
    while len(got_slots) < n and len(sampler) > 0:
        slots, probs = sampler.sample(n - len(got_slots), rng)
        for slot, prob in zip(slots.tolist(), probs.tolist(), strict=True):
            if t._retired[slot]:
                break  # the state changed under this draw: draw the rest again
            t._times_sampled[slot] += 1
            t._meta_dirty[slot] = 1
            got_slots.append(slot)
            got_probs.append(prob)
            if t._times_sampled[slot] >= mts:
                one = np.asarray([slot], dtype=np.int64)
                key = t._keys[slot]
                assert key is not None
                places.append((sampler.place(one), None if remover is None else remover.place(one)))
                t.unselect(one, remover=True)
                exhausted.append(key)
    return Draw(np.asarray(got_slots, dtype=np.int64), np.asarray(got_probs), exhausted, places)


def undraw(table: Table, taken: Draw) -> None:
    """Take back a draw whose answer is refused: ``times_sampled`` as it was, and the items
    it retired held again where they were (those deleted or replaced since stay out)."""
    t = table
    np.subtract.at(t._times_sampled, taken.slots, 1)
    for key, (sampler_place, remover_place) in zip(taken.exhausted, taken.places, strict=True):
        slot = t._index.get(key)
        if slot is None or not t._retired[slot]:
            continue
        t._retired[slot] = 0
        one = np.asarray([slot], dtype=np.int64)
        fields = [t._fields.get(slot, {})] if t.index_fields else None
        priorities, inserted_at = t._priority[one], t._inserted_at[one]
        t.sampler.put_back(one, priorities, inserted_at, fields, sampler_place)
        if t.remover is not None:
            t.remover.put_back(one, priorities, inserted_at, fields, remover_place)
