"""Every selector agrees with a plain Python model under random inserts, removes and updates.

The model keeps, per slot held, its priority, insertion time, score and two counters:
the order of insertion and the order of the last insert-or-update (the heap tie rule).
After each operation the selector's size, its picks and their probabilities must be
what the model says; ``evict`` must pick what repeated ``sample(1)`` + ``remove`` would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlreplay.app.selection.base import Selector
from rlreplay.app.selection.registry import make_selector

ALPHA = 0.7
HALF_LIFE = 3.0


@dataclass
class Held:
    priority: float
    time: float
    score: float
    inserted: int
    touched: int


@dataclass
class Model:
    held: dict[int, Held] = field(default_factory=dict)
    free: list[int] = field(default_factory=list)
    next_slot: int = 0
    clock: int = 0

    def slot(self) -> int:
        if self.free:
            return self.free.pop()
        self.next_slot += 1
        return self.next_slot - 1

    def tick(self) -> int:
        self.clock += 1
        return self.clock


def expected_pick(name: str, model: Model) -> int | None:
    """The one slot a deterministic selector must name; None for random ones."""
    held = model.held
    if name == "fifo":
        return min(held, key=lambda s: held[s].inserted)
    if name == "lifo":
        return max(held, key=lambda s: held[s].inserted)
    if name == "max_heap":
        return min(held, key=lambda s: (-held[s].priority, held[s].touched))
    if name == "min_heap":
        return min(held, key=lambda s: (held[s].priority, held[s].touched))
    if name == "score":
        return min(held, key=lambda s: (-held[s].score, held[s].inserted))
    return None


def expected_probabilities(name: str, model: Model) -> dict[int, float]:
    """Each held slot's chance in one draw, for the random selectors."""
    held = model.held
    if name == "prioritized":
        masses = {s: h.priority**ALPHA if h.priority > 0 else 0.0 for s, h in held.items()}
    elif name == "ptime":
        masses = {s: 2.0 ** (h.time / HALF_LIFE) for s, h in held.items()}
    else:
        masses = {s: 1.0 for s in held}
    total = sum(masses.values())
    if total == 0:
        return {s: 1 / len(held) for s in held}
    return {s: m / total for s, m in masses.items()}


priorities = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5]) | st.floats(0.0, 10.0)
scores = st.none() | st.sampled_from([-1.0, 0.0, 2.0]) | st.floats(-5, 5) | st.just("high")
operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("insert"),
            st.lists(st.tuples(priorities, st.integers(0, 40), scores), min_size=1, max_size=9),
        ),
        st.tuples(st.just("remove"), st.lists(st.integers(0, 10_000), min_size=1, max_size=12)),
        st.tuples(
            st.just("update"),
            st.lists(st.tuples(st.integers(0, 10_000), priorities), min_size=1, max_size=4),
        ),
        st.tuples(st.just("sample"), st.integers(1, 8)),
        st.tuples(st.just("evict"), st.integers(1, 3)),
        st.tuples(
            st.just("put_back"),
            st.tuples(
                st.lists(st.integers(0, 10_000), min_size=1, max_size=4),
                st.lists(st.tuples(priorities, st.integers(0, 40), scores), max_size=3),
            ),
        ),
    ),
    max_size=40,
)

PARAMS: dict[str, dict[str, Any]] = {
    "prioritized": {"exponent": ALPHA},
    "ptime": {"half_life_s": HALF_LIFE},
}
NAMES = ["uniform", "prioritized", "fifo", "lifo", "max_heap", "min_heap", "ptime", "score"]


def check(name: str, selector: Selector, model: Model, rng: np.random.Generator, n: int) -> None:
    assert len(selector) == len(model.held)
    if not model.held:
        return
    picked, probs = selector.sample(n, rng)
    assert picked.dtype == np.int64 and len(picked) == len(probs) == n
    must = expected_pick(name, model)
    if must is not None:
        assert picked.tolist() == [must] * n
        assert probs.tolist() == [1.0] * n
        return
    truth = expected_probabilities(name, model)
    for slot, prob in zip(picked.tolist(), probs.tolist(), strict=True):
        assert slot in truth and truth[slot] > 0
        assert prob == pytest.approx(truth[slot], rel=1e-9)


def apply(
    name: str, selector: Selector, model: Model, op: tuple[Any, ...], rng: np.random.Generator
) -> None:
    kind, arg = op
    held = model.held
    if kind == "insert":
        new = [model.slot() for _ in arg]
        fields = [{} if score is None else {"score": score, "other": 1} for _, _, score in arg]
        selector.insert(
            np.array(new, dtype=np.int64),
            np.array([p for p, _, _ in arg]),
            np.array([float(t) for _, t, _ in arg]),
            fields,
        )
        for slot, (p, t, score) in zip(new, arg, strict=True):
            tick = model.tick()
            number = score if isinstance(score, float) and not math.isnan(score) else -math.inf
            held[slot] = Held(p, float(t), number, tick, tick)
    elif kind == "remove" and held:
        ordered = sorted(held)
        gone = sorted({ordered[i % len(ordered)] for i in arg})
        selector.remove(np.array(gone, dtype=np.int64))
        for slot in gone:
            del held[slot]
            model.free.append(slot)
    elif kind == "update" and held:
        ordered = sorted(held)
        changes = {ordered[i % len(ordered)]: p for i, p in arg}
        selector.update(np.array(list(changes), dtype=np.int64), np.array(list(changes.values())))
        for slot, p in changes.items():
            held[slot].priority = p
            held[slot].touched = model.tick()
    elif kind == "evict" and held:
        k = min(arg, len(held))
        expected = []
        if expected_pick(name, model) is not None:
            shadow = Model(held=dict(held))
            for _ in range(k):
                first = expected_pick(name, shadow)
                assert first is not None
                expected.append(first)
                del shadow.held[first]
        victims = selector.evict(k, rng).tolist()
        assert len(set(victims)) == k and set(victims) <= set(held)
        if expected:
            assert victims == expected
        for slot in victims:
            del held[slot]
            model.free.append(slot)
    elif kind == "put_back" and held:
        # a refused sample: slots taken out with their places, items pushed meanwhile, then
        # the slots held again where they were (the model keeps their insertion numbers)
        ordered = sorted(held)
        taken = np.array(sorted({ordered[i % len(ordered)] for i in arg[0]}), dtype=np.int64)
        kept = {slot: held.pop(slot) for slot in taken.tolist()}
        place = selector.place(taken)
        selector.remove(taken)
        if arg[1]:
            apply(name, selector, model, ("insert", arg[1]), rng)
        fields = [{"score": kept[s].score, "other": 1} for s in taken.tolist()]
        priorities_ = np.array([kept[s].priority for s in taken.tolist()])
        times = np.array([kept[s].time for s in taken.tolist()])
        selector.put_back(taken, priorities_, times, fields, place)
        if type(selector).place is Selector.place:  # no order kept: inserted again, as new
            for slot in taken.tolist():
                kept[slot].inserted = kept[slot].touched = model.tick()
        held.update(kept)
    elif kind == "sample":
        check(name, selector, model, rng, arg)
        return
    check(name, selector, model, rng, 3)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_selector_matches_model(name: str, ops: list[tuple[Any, ...]]) -> None:
    selector = make_selector(name, PARAMS.get(name, {}))
    model = Model()
    rng = np.random.default_rng(0)
    for op in ops:
        apply(name, selector, model, op, rng)
