"""``TagIndex`` against a dict-of-tags model under random puts, replacements, removals and
queries with each operator: ``match`` and ``by_order`` (oldest first) give what a scan of
the model gives, cached matches included (asked again between changes)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlreplay.app.tables.tag_index import TagIndex, parse_where

NAMES = ["a", "b", "c"]
VALUES = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([0.0, 1.0, 1.5, -2.5]),
    st.booleans(),
    st.sampled_from(["", "x", "y", "xy", "z"]),
)
TAGS = st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=3)
NUMBERS = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, 1.0, -1.5]))
STRINGS = st.sampled_from(["", "x", "xy", "y", "zz"])


@st.composite
def conditions(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["eq", "in", "range"]))
    if kind == "eq":
        return draw(VALUES)
    if kind == "in":
        return {"in": draw(st.lists(VALUES, max_size=4))}
    bounds = draw(st.sampled_from([NUMBERS, STRINGS]))
    cond: dict[str, Any] = {}
    low, high = (
        draw(st.sampled_from([None, "gte", "gt"])),
        draw(st.sampled_from([None, "lte", "lt"])),
    )
    if low is None and high is None:
        low = "gte"
    if low:
        cond[low] = draw(bounds)
    if high:
        cond[high] = draw(bounds)
    return cond


WHERE = st.dictionaries(st.sampled_from([*NAMES, "nope"]), conditions(), min_size=1, max_size=2)


def _same(a: Any, b: Any) -> bool:
    """JSON's equality: a bool is not a number; 1 equals 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    return bool(a == b)


def _holds(value: Any, cond: Any) -> bool:
    if value is None:
        return False
    if not isinstance(cond, dict):
        return _same(value, cond)
    if "in" in cond:
        return any(_same(value, v) for v in cond["in"])
    bound = next(iter(cond.values()))
    if isinstance(value, bool) or isinstance(value, str) != isinstance(bound, str):
        return False
    ops = {
        "gte": lambda x, y: x >= y,
        "gt": lambda x, y: x > y,
        "lte": lambda x, y: x <= y,
        "lt": lambda x, y: x < y,
    }
    return all(ops[op](value, b) for op, b in cond.items())


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 15), TAGS),
        st.tuples(st.just("remove"), st.integers(0, 15), st.none()),
        st.tuples(st.just("query"), st.none(), WHERE),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=OPS)
def test_the_index_answers_as_a_scan_of_the_model(ops: list[Any]) -> None:
    index = TagIndex()
    model: dict[int, dict[str, Any]] = {}
    order = np.zeros(16, dtype=np.int64)
    clock = 0
    for op, slot, arg in ops:
        if op == "put":
            clock += 1
            order[slot] = clock  # a push is the newest item
            index.put(slot, dict(arg))
            if arg:
                model[slot] = dict(arg)
            else:
                model.pop(slot, None)
        elif op == "remove":
            index.remove(slot)
            model.pop(slot, None)
        else:
            conds = parse_where(arg)
            expected = {
                s
                for s, tags in model.items()
                if all(_holds(tags.get(n), c) for n, c in arg.items())
            }
            for _ in range(2):  # the second answer comes from the cache
                assert index.match(conds) == expected, (arg, model)
                orders, slots = index.by_order(conds, order)
                assert slots.tolist() == sorted(expected, key=lambda s: order[s])
                assert orders.tolist() == sorted(order[s] for s in expected)
    assert index.of == model
