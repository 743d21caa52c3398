"""Where a table's values live: cached (and dirty until written), in RocksDB, or both.

The writer moves a value between the cache and RocksDB and keeps the table's byte counts
(``bytes_in_cache``, ``bytes_on_disk``) in step; :class:`~rlreplay.app.tables.table.Table`
forwards its methods of the same names here, and no other module calls these.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rlreplay.app.tables.table import Table


def forget_cached(t: Table, slots: np.ndarray) -> None:
    """The cached values at ``slots`` are being replaced: their bytes are uncounted."""
    t._bytes_in_cache -= int(t._size[slots].sum())


def hold_values(
    t: Table,
    slots: np.ndarray,
    slot_list: list[int],
    values: list[bytes],
    sizes: np.ndarray,
    replaced_cached: np.ndarray | None,
) -> None:
    """Keep pushed ``values`` (``sizes``, with their keys) at ``slots`` in the cache,
    dirty; ``replaced_cached``: the slots whose cached values they replace, which
    count as hits (CLOCK)."""
    t._meta_dirty[slots] = 1
    deque(map(t._values.__setitem__, slot_list, values), maxlen=0)
    # a short-lived view of the flag bytearray (a live view would block its growth)
    np.frombuffer(t._dirty, np.uint8)[slots] = 1
    if replaced_cached is not None:
        t._referenced[replaced_cached] = 1
    t._bytes_in_cache += int(sizes.sum())


def mark_written(t: Table, slots: np.ndarray, slot_list: list[int], sizes: list[int]) -> None:
    """The values at ``slots`` (``sizes``, with their keys) and their metadata were
    written through to RocksDB: none is cached."""
    t._meta_dirty[slots] = 0
    values, on_disk, dirty, disk_size = (
        t._values,
        t._on_disk,
        t._dirty,
        t._disk_size,
    )
    for slot, size in zip(slot_list, sizes, strict=True):
        values[slot] = None
        on_disk[slot] = 1
        dirty[slot] = 0
        t._bytes_on_disk += size - int(disk_size[slot])
        disk_size[slot] = size


def populate(t: Table, slot: int, value: bytes, version: int) -> int | None:
    """Cache ``value``, read from RocksDB for ``slot`` at ``version``, unless the slot
    changed since or holds a value already. Returns its size, or None if not taken."""
    if t._dropped or slot >= len(t._keys) or t._keys[slot] is None:
        return None
    if int(t._version[slot]) != version or t._values[slot] is not None:
        return None
    t._values[slot] = value
    t._dirty[slot] = 0
    size = int(t._size[slot])
    t._bytes_in_cache += size
    t.counters.populates += 1
    return size


def evict(t: Table, slot: int) -> int:
    """The value at ``slot`` and its metadata are in RocksDB now: it leaves the cache.
    Returns its size."""
    size = int(t._size[slot])
    if t._dirty[slot] or not t._on_disk[slot]:
        t._bytes_on_disk += size - int(t._disk_size[slot])
        t._disk_size[slot] = size
    t._on_disk[slot] = 1
    t._values[slot] = None
    t._dirty[slot] = t._meta_dirty[slot] = 0
    t._bytes_in_cache -= size
    t.counters.evictions_to_disk += 1
    return size


def mark_checkpointed(t: Table, slots: np.ndarray, wrote: np.ndarray) -> None:
    """A checkpoint's batch holds the metadata of the items at ``slots`` (distinct), and
    the values of those where ``wrote`` (a mask of them) is set."""
    t._meta_dirty[slots] = 0
    written = slots[wrote]
    if not len(written):
        return
    sizes = t._size[written]
    t._bytes_on_disk += int(sizes.sum()) - int(t._disk_size[written].sum())
    t._disk_size[written] = sizes
    # short-lived views of the flag bytearrays (a live view would block their growth)
    np.frombuffer(t._on_disk, np.uint8)[written] = 1
    np.frombuffer(t._dirty, np.uint8)[written] = 0


def unmark_checkpointed(t: Table, slot: int, *, wrote: bool, on_disk: int, disk_size: int) -> None:
    """A checkpoint's batch failed: the item at ``slot`` is to write again, as it was
    before :func:`mark_checkpointed` (``on_disk``, ``disk_size``: its flags then)."""
    t._meta_dirty[slot] = 1
    if wrote:
        t._bytes_on_disk += disk_size - int(t._disk_size[slot])
        t._dirty[slot], t._on_disk[slot] = 1, on_disk
        t._disk_size[slot] = disk_size


def patch_value(t: Table, slot: int, value: bytes, size: int) -> None:
    """A patch's new ``value`` for ``slot`` (``size``: with its key), cached and dirty;
    a value read from RocksDB before it is stale (its version moves on)."""
    if t._values[slot] is not None:
        t._bytes_in_cache -= int(t._size[slot])
    t._values[slot] = value
    t._size[slot] = size
    t._bytes_in_cache += size
    t._dirty[slot] = 1
    t._meta_dirty[slot] = 1
    t._version[slot] += 1
