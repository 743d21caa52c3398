"""A table's own operations: what the writer and a sample's draw ask of it."""

from __future__ import annotations

import numpy as np

from rlreplay.app.tables.config import RemoverSpec, SamplerSpec, TableConfig
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
    slots, probs, used_up = table.draw(64, np.random.default_rng(0))
    assert set(slots.tolist()) <= set(range(5)) and np.allclose(probs, 0.2)
    assert used_up == [] and int(table.times_sampled.sum()) == 64


def test_a_draw_retires_what_it_uses_up_and_undraw_takes_it_back() -> None:
    table = filled(TableConfig(max_times_sampled=1), 3)
    slots, _, used_up = table.draw(10, np.random.default_rng(1))
    assert sorted(used_up) == ["k0", "k1", "k2"] and len(slots) == 3  # no item twice
    assert len(table.sampler) == 0 and all(table.retired[s] for s in slots.tolist())
    table.undraw(slots, used_up)
    assert len(table.sampler) == 3 and int(table.times_sampled.sum()) == 0


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
    slots, probs, _ = table.draw(32, np.random.default_rng(2))
    assert {table.keys[s] for s in slots.tolist()} == {"k1"} and np.allclose(probs, 1.0)
    assert float(table.priority[table.index["k0"]]) == 0.0


def test_restore_hands_items_back_in_insertion_order() -> None:
    table = Table("t", 1, TableConfig(sampler=SamplerSpec(type="fifo")))
    rows = [("b", b"v", 1.0, 2.0, 3, 11, 7), ("a", None, 1.0, 1.0, 0, 11, 2)]
    cached, sizes = table.restore(rows, on_disk=False, fields=[])
    assert sizes == [11, 11] and len(cached) == 2
    slots, _, _ = table.draw(1, np.random.default_rng(0))
    assert table.keys[int(slots[0])] == "a"  # the oldest order first
    assert int(table.times_sampled[table.index["b"]]) == 3
