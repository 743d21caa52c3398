"""The cache ledger (numpy CLOCK log) against the OrderedDict it replaced, op by op."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlreplay.app.storage.cache import CacheLedger


class FakeTable:
    """What the ledger needs of a table: its reference bits, and clearing them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.referenced = np.zeros(64, dtype=np.uint8)

    def clear_referenced(self, slots: np.ndarray) -> None:
        self.referenced[slots] = 0

    def __repr__(self) -> str:
        return self.name


class ReferenceLedger:
    """The ledger as it was: an OrderedDict of (table, slot) -> charge."""

    def __init__(self) -> None:
        self.bytes = 0
        self.order: OrderedDict[tuple[Any, int], int] = OrderedDict()

    def add_many(self, table: Any, slots: list[int], charges: list[int]) -> None:
        for slot, charge in zip(slots, charges, strict=True):
            self.bytes += charge - self.order.get((table, slot), 0)
            self.order[(table, slot)] = charge

    def discard_many(self, table: Any, slots: list[int]) -> None:
        for slot in slots:
            self.bytes -= self.order.pop((table, slot), 0)

    def drop_table(self, table: Any) -> None:
        for entry in [e for e in self.order if e[0] is table]:
            self.bytes -= self.order.pop(entry)

    def victims(self, target: int) -> list[tuple[Any, int]]:
        out = []
        budget = 2 * len(self.order)
        while self.bytes > target and self.order and budget > 0:
            budget -= 1
            entry, charge = self.order.popitem(last=False)
            table, slot = entry
            if table.referenced[slot]:
                table.referenced[slot] = 0
                self.order[entry] = charge
                continue
            self.bytes -= charge
            out.append(entry)
        return out


SLOTS = st.lists(st.integers(0, 63), unique=True, max_size=12)
OP = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 2), SLOTS, st.integers(1, 500)),
    st.tuples(st.just("add1"), st.integers(0, 2), st.integers(0, 63), st.integers(1, 500)),
    st.tuples(st.just("discard"), st.integers(0, 2), SLOTS),
    st.tuples(st.just("hit"), st.integers(0, 2), SLOTS),
    st.tuples(st.just("victims"), st.integers(0, 6000)),
    st.tuples(st.just("drop"), st.integers(0, 2)),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(OP, max_size=60))
# Second chances in one window of two tables: they go to the back in the order they were
# in, not table by table (the ledger once put t0's before t1's, evicting t0's first).
@example(
    ops=[
        ("hit", 1, [0]),
        ("add", 0, [1], 1),
        ("add", 1, [0], 1),
        ("add", 0, [0], 1),
        ("hit", 0, [0]),
        ("victims", 0),
    ]
)
def test_ledger_matches_the_ordered_dict_it_replaced(ops: list[tuple[Any, ...]]) -> None:
    ledger = CacheLedger(limit_bytes=1000)
    ref = ReferenceLedger()
    tables = [FakeTable(f"t{i}") for i in range(3)]
    for op in ops:
        if op[0] == "add":
            _, t, slots, base = op
            charges = [base + slot for slot in slots]
            ledger.add_many(tables[t], slots, charges)
            ref.add_many(tables[t], slots, charges)
        elif op[0] == "add1":  # one value (a populate): the batch form's semantics
            _, t, slot, charge = op
            ledger.add(tables[t], slot, charge)
            ref.add_many(tables[t], [slot], [charge])
        elif op[0] == "discard":
            ledger.discard_many(tables[op[1]], op[2])
            ref.discard_many(tables[op[1]], op[2])
        elif op[0] == "hit":
            tables[op[1]].referenced[op[2]] = 1
        elif op[0] == "victims":
            # the same bits for both: the ledger's run first, then the reference's
            bits = [t.referenced.copy() for t in tables]
            got = ledger.victims(op[1])
            after = [t.referenced.copy() for t in tables]
            for t, b in zip(tables, bits, strict=True):
                t.referenced[:] = b
            assert got == ref.victims(op[1])
            for t, a in zip(tables, after, strict=True):
                np.testing.assert_array_equal(t.referenced, a)
        else:
            ledger.drop_table(tables[op[1]])
            ref.drop_table(tables[op[1]])
            tables[op[1]] = FakeTable(f"t{op[1]}'")
        assert ledger.bytes == ref.bytes
        assert len(ledger) == len(ref.order)
        assert list(ledger.entries().items()) == list(ref.order.items())


def test_a_full_tables_pushes_leave_the_log_bounded() -> None:
    """64 values in and 64 out per push, many times: stale entries are compacted away."""
    ledger = CacheLedger(limit_bytes=10**12)
    table = FakeTable("t")
    table.referenced = np.zeros(200_000, dtype=np.uint8)
    for push in range(2000):
        ledger.add_many(table, list(range(push * 64, push * 64 + 64)), [100] * 64)
        if push >= 50:
            old = push - 50
            ledger.discard_many(table, list(range(old * 64, old * 64 + 64)))
    assert len(ledger) == 50 * 64 and ledger.bytes == 50 * 64 * 100
    assert ledger._hi - ledger._lo < 3 * len(ledger) + 1024 + 64
