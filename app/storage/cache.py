"""The cache ledger: which values are in RAM, how many bytes they take, and which go first.

Values themselves sit in their table's per-slot list (so a cache hit is one list index);
the ledger keeps the global order and byte count across tables. Recency is tracked the
CLOCK way: a hit only sets the slot's reference bit; eviction walks from the oldest
entry, gives referenced entries a second chance (moving them to the back) and evicts
the others. That keeps the hit path to a couple of stores, and eviction LRU-like.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import repeat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.engine.table import Table

# Bytes charged per cached entry on top of key and value: the bytes object header (33),
# the ledger's OrderedDict node and tuple (~120), the key string header (~50), the
# per-slot list and flag entries. Measured with tracemalloc in tests/engine/test_cache.py.
ENTRY_OVERHEAD = 220


class CacheLedger:
    """Global LRU-ish order and byte count of every cached value, bounded by ``limit_bytes``."""

    def __init__(self, *, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.bytes = 0
        self._order: OrderedDict[tuple[Table, int], int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def add(self, table: Table, slot: int, charge: int) -> None:
        """Record a newly cached value of ``charge`` bytes (replacing any older charge)."""
        entry = (table, slot)
        old = self._order.pop(entry, None)
        if old is not None:
            self.bytes -= old
        self._order[entry] = charge
        self.bytes += charge

    def add_many(self, table: Table, slots: list[int], charges: list[int]) -> None:
        """Record newly cached values of ``table``: ``charges[i]`` bytes for ``slots[i]``.

        The batch form of :meth:`add` for the writer's pushes, with the per-entry work in C
        (``dict.get`` and ``update``): an entry already in the ledger takes its new charge
        but keeps its place in the order, so the caller sets its slot's reference bit and
        CLOCK gives it the second chance a hit would. ``slots`` holds no duplicates.
        """
        order = self._order
        entries = [(table, slot) for slot in slots]
        old = sum(map(order.get, entries, repeat(0)))
        order.update(zip(entries, charges, strict=True))
        self.bytes += sum(charges) - old

    def discard(self, table: Table, slot: int) -> None:
        """Forget a value that left the cache (deleted or evicted)."""
        old = self._order.pop((table, slot), None)
        if old is not None:
            self.bytes -= old

    def discard_many(self, table: Table, slots: list[int]) -> None:
        """:meth:`discard` for many slots of ``table`` (the per-entry work in C)."""
        self.bytes -= sum(map(self._order.pop, [(table, slot) for slot in slots], repeat(0)))

    def drop_table(self, table: Table) -> None:
        """Forget every value of a table."""
        for entry in [e for e in self._order if e[0] is table]:
            self.bytes -= self._order.pop(entry)

    @property
    def over(self) -> bool:
        """True when the cached bytes pass the limit."""
        return self.bytes > self.limit_bytes

    def victims(self, target_bytes: int) -> list[tuple[Table, int]]:
        """Pick entries to evict until the cache would hold at most ``target_bytes``.

        Entries picked are removed from the ledger; the caller moves their values out.
        Referenced entries get a second chance: their bit is cleared and they go to the back.
        """
        out: list[tuple[Table, int]] = []
        order = self._order
        budget = len(order) * 2  # every entry is looked at at most twice
        while self.bytes > target_bytes and order and budget > 0:
            budget -= 1
            entry, charge = order.popitem(last=False)
            table, slot = entry
            if table.referenced[slot]:
                table.referenced[slot] = 0
                order[entry] = charge
                continue
            self.bytes -= charge
            out.append(entry)
        return out
