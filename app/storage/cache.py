"""The cache ledger: which values are in RAM, how many bytes they take, and which go first.

Values themselves sit in their table's per-slot list (so a cache hit is one list index);
the ledger keeps the global order and byte count across tables. Recency is tracked the
CLOCK way: a hit only sets the slot's reference bit; eviction walks from the oldest
entry, gives referenced entries a second chance (moving them to the back) and evicts
the others. That keeps the hit path to a couple of stores, and eviction LRU-like.

The order is a log of ``(table, slot, ticket)`` entries in numpy arrays, as
:class:`~rlreplay.app.selection.insertion_order.InsertionLog` keeps its own: each cached slot has a
ticket and a charge in per-table arrays, a discard only forgets the ticket (the log entry
goes stale, skipped lazily and dropped when the log is compacted), and a push's 64 values
enter or leave in a few numpy calls. An ``OrderedDict`` of ``(table, slot)`` tuples did the
same work per entry, a Python step each (commit 9b7752a has the figures);
``tests/storage/test_cache_ledger.py`` checks the two agree op by op.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from rlreplay.app.selection.slot_array import grown


class CachedTable(Protocol):
    """What the ledger needs of a table: its per-slot CLOCK bits, set by cache hits, and
    a way to clear them (the table owns its columns)."""

    @property
    def referenced(self) -> npt.NDArray[np.uint8]: ...

    def clear_referenced(self, slots: npt.NDArray[np.int64]) -> None: ...


Table = TypeVar("Table", bound=CachedTable)

# Bytes charged per cached entry on top of key and value: the bytes object header (33),
# the key string header (~50), the index's dict entry, the per-slot list and flag entries
# and the ledger's log entry, ticket and charge (36). It was measured with the ledger's
# earlier OrderedDict node and tuple (~120) and is kept: a little generous now.
ENTRY_OVERHEAD = 220


class CacheLedger(Generic[Table]):
    """Global CLOCK order and byte count of every cached value, bounded by ``limit_bytes``."""

    def __init__(self, *, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.bytes = 0
        self._tables: list[Table | None] = []  # by number (None: dropped)
        self._numbers: dict[int, int] = {}  # id(table) -> number
        self._tickets: list[npt.NDArray[np.int64]] = []  # per table, per slot; -1: not held
        self._charges: list[npt.NDArray[np.int64]] = []  # per table, per slot
        self._log_table = np.empty(1024, dtype=np.int64)
        self._log_slot = np.empty(1024, dtype=np.int64)
        self._log_ticket = np.empty(1024, dtype=np.int64)
        self._lo = self._hi = 0
        self._next_ticket = 0
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def _number(self, table: Table, top_slot: int) -> int:
        """The table's number, its per-slot arrays grown past ``top_slot``."""
        n = self._numbers.get(id(table))
        if n is None:
            n = self._numbers[id(table)] = len(self._tables)
            self._tables.append(table)
            self._tickets.append(np.full(16, -1, dtype=np.int64))
            self._charges.append(np.zeros(16, dtype=np.int64))
        if top_slot >= len(self._tickets[n]):
            self._tickets[n] = grown(self._tickets[n], top_slot + 1, -1)
            self._charges[n] = grown(self._charges[n], top_slot + 1, 0)
        return n

    def add(self, table: Table, slot: int, charge: int) -> None:
        """Record a newly cached value of ``charge`` bytes (replacing any older charge and
        keeping its place, as :meth:`add_many` does): one value read back from RocksDB,
        without the numpy calls of a batch."""
        n = self._number(table, slot)
        tickets, charges = self._tickets[n], self._charges[n]
        if tickets[slot] >= 0:
            self.bytes += charge - int(charges[slot])
        else:
            if self._hi == len(self._log_slot):
                self._compact(room=1)
            hi, ticket = self._hi, self._next_ticket
            self._log_table[hi], self._log_slot[hi], self._log_ticket[hi] = n, slot, ticket
            self._hi, self._next_ticket = hi + 1, ticket + 1
            tickets[slot] = ticket
            self._live += 1
            self.bytes += charge
        charges[slot] = charge

    def add_many(self, table: Table, slots: list[int], charges: list[int]) -> None:
        """Record newly cached values of ``table``: ``charges[i]`` bytes for ``slots[i]``.

        An entry already in the ledger takes its new charge but keeps its place in the
        order, so the caller sets its slot's reference bit and CLOCK gives it the second
        chance a hit would. ``slots`` holds no duplicates.
        """
        if not slots:
            return
        at = np.asarray(slots, dtype=np.int64)
        new_charges = np.asarray(charges, dtype=np.int64)
        n = self._number(table, int(at.max()))
        tickets, held_charges = self._tickets[n], self._charges[n]
        held = tickets[at] >= 0
        self.bytes += int(new_charges.sum()) - int(held_charges[at[held]].sum())
        held_charges[at] = new_charges
        fresh = at if not held.any() else at[~held]
        if len(fresh):
            tickets[fresh] = self._append(n, fresh)
            self._live += len(fresh)

    def _append(
        self, n: int | npt.NDArray[np.int64], slots: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        """Log ``slots`` of table ``n`` (one number, or one per slot) as the newest
        entries, in their order; their new tickets."""
        k = len(slots)
        if self._hi + k > len(self._log_slot):
            self._compact(room=k)
        tickets = np.arange(self._next_ticket, self._next_ticket + k, dtype=np.int64)
        self._next_ticket += k
        end = self._hi + k
        self._log_table[self._hi : end] = n
        self._log_slot[self._hi : end] = slots
        self._log_ticket[self._hi : end] = tickets
        self._hi = end
        return tickets

    def discard_many(self, table: Table, slots: list[int]) -> None:
        """Forget values of ``table`` that left the cache (those it holds; no duplicates)."""
        n = self._numbers.get(id(table))
        if n is None or not slots:
            return
        at = np.asarray(slots, dtype=np.int64)
        tickets = self._tickets[n]
        at = at[at < len(tickets)]
        at = at[tickets[at] >= 0]
        if not len(at):
            return
        self.bytes -= int(self._charges[n][at].sum())
        tickets[at] = -1
        self._live -= len(at)
        if self._hi - self._lo > 2 * self._live + 1024:
            self._compact(room=0)

    def drop_table(self, table: Table) -> None:
        """Forget every value of a table."""
        n = self._numbers.get(id(table))
        if n is None:
            return
        held = self._tickets[n] >= 0
        self.bytes -= int(self._charges[n][held].sum())
        self._live -= int(held.sum())
        # its log entries go stale; a new table is a new number even at the same address
        del self._numbers[id(table)]
        self._tables[n] = None
        self._tickets[n] = self._charges[n] = np.zeros(0, dtype=np.int64)

    @property
    def over(self) -> bool:
        """True when the cached bytes pass the limit."""
        return self.bytes > self.limit_bytes

    def entries(self) -> dict[tuple[Table, int], int]:
        """Every held entry and its charge, oldest first (O(n); for tests)."""
        at = self._live_positions(self._lo, self._hi)
        tables = self._tables
        return {
            (tables[n], slot): int(self._charges[n][slot])
            for n, slot in zip(
                self._log_table[at].tolist(), self._log_slot[at].tolist(), strict=True
            )
        }

    def victims(self, target_bytes: int) -> list[tuple[Table, int]]:
        """Pick entries to evict until the cache would hold at most ``target_bytes``.

        Entries picked are removed from the ledger; the caller moves their values out.
        Referenced entries get a second chance: their bit is cleared and they go to the back.
        The log is walked a window at a time, each window's entries decided together.
        """
        out: list[tuple[Table, int]] = []
        budget = 2 * self._live  # every entry is looked at at most twice
        width = 256
        while self.bytes > target_bytes and self._live and budget > 0:
            hi = min(self._hi, self._lo + width)
            at = self._live_positions(self._lo, hi)[:budget]
            width = min(2 * width, 65536)
            if not len(at):
                self._lo = hi
                continue
            numbers, slots = self._log_table[at], self._log_slot[at]
            referenced = np.zeros(len(at), dtype=bool)
            charges = np.zeros(len(at), dtype=np.int64)
            tables = self._tables
            for n in np.unique(numbers).tolist():
                mine = numbers == n
                referenced[mine] = tables[n].referenced[slots[mine]] != 0
                charges[mine] = self._charges[n][slots[mine]]
            # entries are decided in order until the evicted ones bring the bytes down
            freed = np.cumsum(np.where(referenced, 0, charges))
            enough = np.flatnonzero(self.bytes - freed <= target_bytes)
            count = int(enough[0]) + 1 if len(enough) else len(at)
            budget -= count
            numbers, slots = numbers[:count], slots[:count]
            referenced, charges = referenced[:count], charges[:count]
            self._lo = int(at[count - 1]) + 1
            for n in np.unique(numbers).tolist():
                mine = numbers == n
                table = tables[n]
                assert table is not None
                again = slots[mine & referenced]
                if len(again):  # second chance: the bit cleared
                    table.clear_referenced(again)
                self._tickets[n][slots[mine & ~referenced]] = -1
            if referenced.any():  # and to the back, in their order across tables
                back_numbers, back_slots = numbers[referenced], slots[referenced]
                tickets = self._append(back_numbers, back_slots)
                for n in np.unique(back_numbers).tolist():
                    mine = back_numbers == n
                    self._tickets[n][back_slots[mine]] = tickets[mine]
            evicted = ~referenced
            self.bytes -= int(charges[evicted].sum())
            self._live -= int(evicted.sum())
            out.extend(
                (tables[n], slot)
                for n, slot in zip(numbers[evicted].tolist(), slots[evicted].tolist(), strict=True)
            )
        return out

    def _live_positions(self, lo: int, hi: int) -> npt.NDArray[np.int64]:
        """The log positions of the held entries between ``lo`` and ``hi``, in order."""
        numbers, slots = self._log_table[lo:hi], self._log_slot[lo:hi]
        current = np.full(hi - lo, -2, dtype=np.int64)
        for n in np.unique(numbers).tolist():
            if self._tables[n] is not None:
                mine = numbers == n
                current[mine] = self._tickets[n][slots[mine]]
        at: npt.NDArray[np.int64] = np.flatnonzero(current == self._log_ticket[lo:hi]) + lo
        return at

    def _compact(self, room: int) -> None:
        """Drops stale entries and makes space for ``room`` more (growing when half full)."""
        at = self._live_positions(self._lo, self._hi)
        live = (self._log_table[at], self._log_slot[at], self._log_ticket[at])
        size = len(self._log_slot)
        if 2 * (len(at) + room) > size:
            size = max(2 * size, 2 * (len(at) + room))
            self._log_table = np.empty(size, dtype=np.int64)
            self._log_slot = np.empty(size, dtype=np.int64)
            self._log_ticket = np.empty(size, dtype=np.int64)
        k = len(at)
        self._log_table[:k], self._log_slot[:k], self._log_ticket[:k] = live
        self._lo, self._hi = 0, k
