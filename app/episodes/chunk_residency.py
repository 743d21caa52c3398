"""Which chunks of an episode table are held in memory: its entries in the cache ledger.

The cache ledger (:class:`~rlreplay.app.storage.cache.CacheLedger`) bounds what the server
holds, across tables, by ``cache_memory_limit_mb``; an episode table's steps count there
like item values. Each held sealed chunk of an episode (every field's values for its run
of steps, as held: compressed or not) and each open tail (the steps it holds) is an entry,
a *residency slot* here, charged its bytes. When the ledger is over its limit, the writer
moves sealed chunks it picks to RocksDB (hybrid and disk modes) and drops them from
memory; a read of such a chunk fetches it back (:meth:`ChunkResidency.fetch`). Open tails
change with every append and are never moved: their reference bit stays set, so the
ledger's CLOCK always passes them over. One more entry of the same kind stands for the
table's cache of decompressed chunks, charged what it holds when the writer last looked
(:meth:`ChunkResidency.charge_decompressed`).

The episode table changes the slots as it seals, evicts and deletes; the ledger follows
when the writer hands it :meth:`ChunkResidency.take_changes`. A slot the ledger may still
name is reused only after that, so an eviction never meets a slot that changed owner.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from rlreplay.app.storage.layout import chunk_key

__all__ = ["DECOMPRESSED", "TAIL", "ChunkResidency", "ChunkStore"]

#: The chunk number of an episode's open tail.
TAIL = -1
#: The chunk number of the entry that stands for the table's cache of decompressed chunks.
DECOMPRESSED = -2
#: Bytes charged per held chunk on top of its values: the arrays' or bytes' headers and
#: the table's lists that name it.
CHUNK_OVERHEAD = 200


class ChunkStore(Protocol):
    """Where evicted chunks are read back from (the RocksDB store)."""

    def get_many(self, keys: list[bytes]) -> list[bytes | None]: ...


class ChunkResidency:
    """An episode table's held chunks, as the cache ledger's entries (see the module
    docstring). ``owner`` of a slot: ``(the episode's steps, chunk number or TAIL)``."""

    def __init__(self) -> None:
        self._referenced = np.zeros(64, dtype=np.uint8)
        self._pinned = np.zeros(64, dtype=np.bool_)
        self._owners: list[tuple[Any, int] | None] = []
        self._in_ledger: list[bool] = []
        self._free: list[int] = []
        self._added: dict[int, int] = {}  # slot → charge, for the ledger
        self._gone: list[int] = []  # slots the ledger holds whose chunk left memory
        #: Bytes held (what the ledger is charged once it has taken the changes).
        self.held_bytes = 0
        self._charges: dict[int, int] = {}
        #: Where evicted chunks are (hybrid and disk modes), and the table's key prefix.
        self.store: ChunkStore | None = None
        self.prefix = b""
        self._decompressed = -1  # the slot standing for the decompressed chunks' cache

    # -- the ledger's view (CachedTable) ------------------------------------------------

    @property
    def referenced(self) -> npt.NDArray[np.uint8]:
        """Slot → its CLOCK bit (set by reads; always set for open tails)."""
        return self._referenced

    def clear_referenced(self, slots: npt.NDArray[np.int64]) -> None:
        """The ledger gave ``slots`` their second chance (tails keep their bit)."""
        self._referenced[slots[~self._pinned[slots]]] = 0

    def take_changes(self) -> tuple[list[int], list[int], list[int]]:
        """What the ledger must forget and learn since the last call: (slots gone, slots
        held, their charges); the slots gone are free for reuse from now on."""
        gone, self._gone = self._gone, []
        for slot in gone:
            self._in_ledger[slot] = False
        self._free.extend(gone)
        added = list(self._added)
        charges = [self._added[slot] for slot in added]
        self._added = {}
        for slot in added:
            self._in_ledger[slot] = True
        return gone, added, charges

    # -- the table's --------------------------------------------------------------------

    def hold(self, owner: Any, chunk: int, charge: int) -> int:
        """A new held chunk (``TAIL``: an open tail) of ``charge`` bytes; its slot."""
        if self._free:
            slot = self._free.pop()
        else:
            slot = len(self._owners)
            self._owners.append(None)
            self._in_ledger.append(False)
            if slot >= len(self._referenced):
                cap = 2 * len(self._referenced)
                self._referenced = _grown(self._referenced, cap)
                self._pinned = _grown(self._pinned, cap)
        self._owners[slot] = (owner, chunk)
        self._referenced[slot] = 1
        self._pinned[slot] = chunk < 0
        self._added[slot] = charge + CHUNK_OVERHEAD
        self._charges[slot] = charge + CHUNK_OVERHEAD
        self.held_bytes += charge + CHUNK_OVERHEAD
        return slot

    def recharge(self, slot: int, charge: int) -> None:
        """A held chunk now takes ``charge`` bytes (compressed since it was held)."""
        new = charge + CHUNK_OVERHEAD
        self.held_bytes += new - self._charges[slot]
        self._charges[slot] = new
        self._added[slot] = new

    def release(self, slot: int, *, forgotten: bool = False) -> None:
        """Slot ``slot``'s chunk left memory (sealed, deleted, or evicted: ``forgotten``,
        the ledger gave it up already)."""
        self._owners[slot] = None
        self._pinned[slot] = False
        self.held_bytes -= self._charges.pop(slot)
        self._added.pop(slot, None)
        if self._in_ledger[slot] and not forgotten:
            self._gone.append(slot)
        else:
            self._in_ledger[slot] = False
            self._free.append(slot)

    def charge_decompressed(self, nbytes: int) -> None:
        """The table's cache of decompressed chunks holds ``nbytes`` now."""
        if self._decompressed < 0:
            if nbytes:
                self._decompressed = self.hold(None, DECOMPRESSED, nbytes)
        elif nbytes + CHUNK_OVERHEAD != self._charges[self._decompressed]:
            self.recharge(self._decompressed, nbytes)

    def touch(self, slot: int) -> None:
        """A read used slot ``slot``'s chunk (its CLOCK bit)."""
        self._referenced[slot] = 1

    def charge(self, slot: int) -> int:
        """What held slot ``slot`` is charged in the ledger."""
        return self._charges[slot]

    def owner(self, slot: int) -> tuple[Any, int] | None:
        """``(steps, chunk)`` held at ``slot``, or None."""
        return self._owners[slot]

    # -- reads of evicted chunks --------------------------------------------------------

    def key(self, created: int, field: str, chunk: int) -> bytes:
        """The RocksDB key of chunk ``chunk`` of ``field`` of the episode ``created``."""
        return chunk_key(self.prefix, created, field, chunk)

    def fetch(self, keys: list[bytes]) -> list[bytes]:
        """The stored bytes of evicted chunks. Called where a read needs them: samples
        build windows synchronously between drawing starts and answering (the table may
        change across an await), so those reads wait on RocksDB here; a read route fetches
        first through the blocking-I/O threads (see
        :mod:`~rlreplay.app.episodes.chunk_fetch`).

        Raises:
            OSError: RocksDB failed, or it lacks a chunk the table says it holds.
        """
        if self.store is None:
            raise OSError("an evicted chunk with no store to read it from")
        got = self.store.get_many(keys)
        missing = [k for k, raw in zip(keys, got, strict=True) if raw is None]
        if missing:
            raise OSError(
                f"RocksDB lacks {len(missing)} chunk(s) it was given, first {missing[0]!r}"
            )
        return [raw for raw in got if raw is not None]


def _grown(array: np.ndarray, cap: int) -> np.ndarray:
    out = np.zeros(cap, dtype=array.dtype)
    out[: len(array)] = array
    return out
