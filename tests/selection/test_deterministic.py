"""FIFO, LIFO and the heaps name the right item, as samplers and as removers."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from rlreplay.app.selection.base import Selector
from rlreplay.app.selection.heap import MaxHeapSelector, MinHeapSelector
from rlreplay.app.selection.insertion_order import FifoSelector, InsertionLog, LifoSelector
from rlreplay.app.selection.uniform import UniformSampler

RNG = np.random.default_rng(0)


def slots(*values: int) -> npt.NDArray[np.int64]:
    return np.asarray(values, dtype=np.int64)


def pick(selector: Selector) -> int:
    picked, probs = selector.sample(4, RNG)
    assert len(set(picked.tolist())) == 1 and probs.tolist() == [1.0] * 4
    return int(picked[0])


def drain(selector: Selector) -> list[int]:
    """Picks and removes until empty: the order a queue of this kind hands items out."""
    order = []
    while len(selector):
        slot = pick(selector)
        order.append(slot)
        selector.remove(slots(slot))
    return order


def insert(selector: Selector, order: list[int], priorities: list[float] | None = None) -> None:
    prios = np.ones(len(order)) if priorities is None else np.array(priorities)
    selector.insert(np.array(order, dtype=np.int64), prios, np.zeros(len(order)))


def test_fifo_hands_out_in_insertion_order_not_slot_order() -> None:
    fifo = FifoSelector()
    insert(fifo, [5, 2, 9])
    insert(fifo, [0, 7])
    assert drain(fifo) == [5, 2, 9, 0, 7]


def test_lifo_hands_out_newest_first() -> None:
    lifo = LifoSelector()
    insert(lifo, [5, 2, 9])
    insert(lifo, [0, 7])
    assert drain(lifo) == [7, 0, 9, 2, 5]


def test_reused_slot_counts_as_new() -> None:
    fifo, lifo = FifoSelector(), LifoSelector()
    for selector in (fifo, lifo):
        insert(selector, [0, 1, 2])
        selector.remove(slots(0))
        insert(selector, [0])  # slot 0 is a new item now, the newest
    assert drain(fifo) == [1, 2, 0]
    assert drain(lifo) == [0, 2, 1]


def test_removal_from_the_far_end_keeps_memory_bounded() -> None:
    # A LIFO sampler with a FIFO remover: the log's stale tail must be compacted away.
    lifo = LifoSelector()
    insert(lifo, list(range(1000)))
    next_slot = 1000
    for step in range(200):
        oldest = list(range(step * 100, step * 100 + 100))
        lifo.remove(np.array(oldest, dtype=np.int64))
        insert(lifo, list(range(next_slot, next_slot + 100)))
        next_slot += 100
        assert pick(lifo) == next_slot - 1
    assert len(lifo) == 1000
    assert lifo.index_bytes() < 600_000  # not 21,000 entries' worth of dead log


def test_insertion_log_oldest_and_newest_k_skip_removed() -> None:
    log = InsertionLog()
    log.append(np.arange(10, dtype=np.int64))
    log.discard(slots(0, 2, 9, 5))
    np.testing.assert_array_equal(log.oldest_k(3), [1, 3, 4])
    np.testing.assert_array_equal(log.newest_k(3), [8, 7, 6])
    np.testing.assert_array_equal(log.ordered(), [1, 3, 4, 6, 7, 8])


@pytest.mark.parametrize("remover", [FifoSelector, LifoSelector])
def test_evicting_k_at_a_time_looks_at_each_log_entry_about_once(
    remover: type[FifoSelector | LifoSelector], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capped table evicts ``k`` per push: the entries evicted before are skipped once,
    not rescanned by every later eviction until a compaction (which made a FIFO-capped
    table's pushes several times slower)."""
    scanned = 0
    live_positions = InsertionLog._live_positions

    def counting(log: InsertionLog, lo: int, hi: int) -> np.ndarray:
        nonlocal scanned
        scanned += hi - lo
        return live_positions(log, lo, hi)

    monkeypatch.setattr(InsertionLog, "_live_positions", counting)
    sel = remover()
    rng = np.random.default_rng(0)
    insert(sel, list(range(50_000)))
    next_slot, evicted = 50_000, []
    for _ in range(500):
        insert(sel, list(range(next_slot, next_slot + 64)))
        next_slot += 64
        evicted.extend(sel.evict(64, rng).tolist())
    assert scanned < 4 * 500 * 64
    assert len(sel) == 50_000
    if remover is FifoSelector:
        assert evicted == list(range(500 * 64))
    else:
        assert evicted == [
            s for b in range(500) for s in range(50_063 + 64 * b, 49_999 + 64 * b, -1)
        ]


def test_max_heap_highest_priority_first_ties_fifo() -> None:
    heap = MaxHeapSelector()
    insert(heap, [0, 1, 2, 3, 4], [1.0, 5.0, 3.0, 5.0, 0.0])
    assert drain(heap) == [1, 3, 2, 0, 4]


def test_min_heap_lowest_priority_first_ties_fifo() -> None:
    heap = MinHeapSelector()
    insert(heap, [0, 1, 2, 3, 4], [1.0, 5.0, 0.0, 5.0, 0.0])
    assert drain(heap) == [2, 4, 0, 1, 3]


def test_heap_update_reorders_and_updated_item_goes_behind_equals() -> None:
    heap = MaxHeapSelector()
    insert(heap, [0, 1, 2], [1.0, 2.0, 3.0])
    heap.update(slots(0, 2), np.array([10.0, 0.5]))
    assert pick(heap) == 0
    heap.update(slots(0), np.array([2.0]))  # now equal to slot 1, but updated later
    assert drain(heap) == [1, 0, 2]


def test_heap_many_changes_at_once() -> None:
    rng = np.random.default_rng(3)
    heap = MinHeapSelector()
    priorities = rng.random(5000)
    heap.insert(np.arange(5000), priorities, np.zeros(5000))
    changed = rng.choice(5000, size=700, replace=False)
    priorities[changed] = rng.random(700) * 0.01
    heap.update(changed.astype(np.int64), priorities[changed])
    gone = rng.choice(5000, size=300, replace=False)
    heap.remove(gone.astype(np.int64))
    priorities[gone] = np.inf
    victims = heap.evict(50, rng)
    np.testing.assert_array_equal(victims, np.argsort(priorities, kind="stable")[:50])


def test_removers_evict_in_their_order() -> None:
    fifo, lifo, low = FifoSelector(), LifoSelector(), MinHeapSelector()
    for selector in (fifo, lifo, low):
        insert(selector, [3, 1, 4, 0, 2], [5.0, 4.0, 3.0, 2.0, 1.0])
    assert fifo.evict(2, RNG).tolist() == [3, 1]
    assert lifo.evict(2, RNG).tolist() == [2, 0]
    assert low.evict(2, RNG).tolist() == [2, 0]
    assert drain(fifo) == [4, 0, 2]
    assert drain(lifo) == [4, 1, 3]
    assert drain(low) == [4, 1, 3]


def test_uniform_evict_is_distinct_and_drops() -> None:
    uniform = UniformSampler()
    insert(uniform, list(range(100)))
    victims = uniform.evict(60, np.random.default_rng(1))
    assert len(set(victims.tolist())) == 60
    assert len(uniform) == 40
    rest = set(uniform.sample(10_000, np.random.default_rng(2))[0].tolist())
    assert rest == set(range(100)) - set(victims.tolist())
