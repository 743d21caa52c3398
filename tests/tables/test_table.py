"""A table's own operations: what the writer and a sample's draw ask of it."""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay.app.tables.config import RemoverSpec, SamplerSpec, TableConfig
from rlreplay.app.tables.draws import draw, undraw
from rlreplay.app.tables.table import Table


def filled(config: TableConfig, n: int, *, first: int = 0) -> Table:
    table = Table("t", 1, config)
    add(table, [f"k{i}" for i in range(first, first + n)])
    return table


def add(table: Table, keys: list[str], priority: float = 1.0, ts: float = 1.0) -> np.ndarray:
    slot_list = table.alloc_slots(keys)
    slots = np.array(slot_list, dtype=np.int64)
    prios = np.full(len(keys), priority)
    table.assign(slots, slot_list, prios, np.full(len(keys), 10), ts, 1, None, [])
    table.select(slots, prios, ts, None)
    return slots


def test_assigned_items_are_selected_and_counted() -> None:
    table = filled(TableConfig(), 5)
    assert len(table.sampler) == 5 and table.counters.inserts == 5
    slots, probs, used_up, _ = draw(table, 64, np.random.default_rng(0))
    assert set(slots.tolist()) <= set(range(5)) and np.allclose(probs, 0.2)
    assert used_up == [] and int(table.times_sampled.sum()) == 64


def test_a_draw_retires_what_it_uses_up_and_undraw_takes_it_back() -> None:
    table = filled(TableConfig(max_times_sampled=1), 3)
    taken = draw(table, 10, np.random.default_rng(1))
    slots, used_up = taken.slots, taken.exhausted
    assert sorted(used_up) == ["k0", "k1", "k2"] and len(slots) == 3  # no item twice
    assert len(table.sampler) == 0 and all(table.retired[s] for s in slots.tolist())
    undraw(table, taken)
    assert len(table.sampler) == 3 and int(table.times_sampled.sum()) == 0


@pytest.mark.parametrize(
    ("sampler", "remover", "order"),
    [
        ("fifo", "fifo", [0, 1, 2, 3, 4, 5, 6]),
        ("lifo", "fifo", [6, 5, 4, 3, 2, 1, 0]),
        ("fifo", "lifo", [0, 1, 2, 3, 4, 5, 6]),
        ("max_heap", "min_heap", [0, 1, 2, 3, 4, 5, 6]),  # equal priorities: FIFO
    ],
)
def test_undraw_holds_the_items_again_in_their_places(
    sampler: str, remover: str, order: list[int]
) -> None:
    """A refused sample consumes nothing: after it (and a push), draws pick what they would
    have, and the remover evicts what it would have."""
    config = TableConfig(
        sampler=SamplerSpec(type=sampler),
        remover=RemoverSpec(type=remover),
        max_times_sampled=1,
        max_size=100,
    )
    rng = np.random.default_rng(0)
    untouched, table = filled(config, 6), filled(config, 6)
    taken = draw(table, 3, rng)
    assert taken.exhausted == [f"k{i}" for i in order if i < 6][:3]
    undraw(table, taken)
    for t in (untouched, table):
        add(t, ["k6"], ts=6.0)
    assert untouched.remover is not None and table.remover is not None
    assert table.remover.evict(2, rng).tolist() == untouched.remover.evict(2, rng).tolist()
    expected = [f"k{i}" for i in order]
    assert draw(table, 7, rng).exhausted == draw(untouched, 7, rng).exhausted == expected


def test_excess_is_what_the_remover_gives_up_oldest_first() -> None:
    table = Table("t", 1, TableConfig(max_size=3, remover=RemoverSpec(type="fifo")))
    for i in range(5):
        add(table, [f"k{i}"], ts=float(i))
    gone = table.excess(np.random.default_rng(0))
    assert [table.keys[s] for s in gone.tolist()] == ["k0", "k1"]
    table.unselect(gone, remover=False)
    assert len(table.sampler) == 3


def test_priorities_change_selection_and_skip_missing_keys() -> None:
    table = filled(TableConfig(sampler=SamplerSpec(type="prioritized", exponent=1.0)), 2)
    table.set_priorities(["k0", "nope"], [0.0, 5.0])
    slots, probs, _, _ = draw(table, 32, np.random.default_rng(2))
    assert {table.keys[s] for s in slots.tolist()} == {"k1"} and np.allclose(probs, 1.0)
    assert float(table.priority[table.index["k0"]]) == 0.0


def test_restore_hands_items_back_in_insertion_order() -> None:
    table = Table("t", 1, TableConfig(sampler=SamplerSpec(type="fifo")))
    rows = [("b", b"v", 1.0, 2.0, 3, 11, 7), ("a", None, 1.0, 1.0, 0, 11, 2)]
    cached, sizes = table.restore(rows, on_disk=False, fields=[])
    assert sizes == [11, 11] and len(cached) == 2
    slots, _, _, _ = draw(table, 1, np.random.default_rng(0))
    assert table.keys[int(slots[0])] == "a"  # the oldest order first
    assert int(table.times_sampled[table.index["b"]]) == 3
