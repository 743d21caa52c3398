"""Loading a table's recovered items: the columns of each, then the selectors in order.

Recovery (``workers/storage.py``) reads the items of a table back from RocksDB or from a
snapshot and hands them to :meth:`Table.restore <rlreplay.app.tables.table.Table.restore>`,
which calls :func:`restore_items`. It runs before the writer starts, so nothing is pending.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rlreplay.app.tables.rollouts import NO_VERSION

if TYPE_CHECKING:
    from rlreplay.app.tables.table import Table


def restore_items(
    t: Table, rows: list[tuple[Any, ...]], *, on_disk: bool, fields: list[dict[str, Any]]
) -> tuple[list[int], list[int]]:
    """Load recovered items into ``t``: each row is (key, value or None, priority,
    inserted_at, times_sampled, size, order, and optionally its rollout metadata or None);
    the selectors get them in their original insertion order.

    Args:
        t: The table, empty of these keys.
        rows: The items.
        on_disk: Their values are in RocksDB (the rows' values are None), not cached.
        fields: The indexed fields of each row, for plugin samplers (or empty).

    Returns:
        The slots whose values are now cached, and their sizes (for the cache ledger).
    """
    if not rows:
        return [], []
    by_order = sorted(range(len(rows)), key=lambda i: rows[i][6])
    rows = [rows[i] for i in by_order]
    if fields:
        fields = [fields[i] for i in by_order]
    slots = np.empty(len(rows), dtype=np.int64)
    cached: list[int] = []
    sizes: list[int] = []
    rollouts = t.rollouts
    for i, (key, value, prio, ts, sampled, size, order, *more) in enumerate(rows):
        slot = t.alloc_slot(key)
        t._policy_version[slot] = NO_VERSION
        if more and more[0] is not None:
            rollouts.restore(slot, more[0])
        slots[i] = slot
        t._order[slot] = order
        t._priority[slot] = prio
        t._inserted_at[slot] = ts
        t._times_sampled[slot] = sampled
        t._size[slot] = size
        t._version[slot] += 1
        if on_disk:
            t._on_disk[slot] = 1
            t._disk_size[slot] = size
            t._bytes_on_disk += size
        else:
            t._values[slot] = value
            t._dirty[slot] = 1
            cached.append(slot)
            sizes.append(size)
            t._bytes_in_cache += size
    t._next_order = int(t._order[slots].max()) + 1
    given = fields if t.index_fields else None
    if given is not None:
        t._fields.update(zip(slots.tolist(), given, strict=True))
    t.sampler.insert(slots, t._priority[slots], t._inserted_at[slots], given)
    if t.remover is not None:
        t.remover.insert(slots, t._priority[slots], t._inserted_at[slots], given)
    return cached, sizes
