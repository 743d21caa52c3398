"""The writer's part of rollout tables: applying patches, acknowledgements and policy
versions (live, and when the log is replayed).

A patch's values were merged when it was accepted (the pending index showed them at once);
here they replace the stored values, in every storage mode as a cached, dirty value that a
checkpoint or an eviction writes to RocksDB, like a push's in hybrid mode. The item keeps
its place, priority, metadata and consumption.
"""

from __future__ import annotations

import itertools

from rlreplay.app.writer.ops import AckOp, PatchOp, VersionOp
from rlreplay.app.writer.state import EngineState, cache_charge

__all__ = ["apply_ack", "apply_patch", "apply_version"]


def apply_patch(state: EngineState, op: PatchOp) -> None:
    """Store a patch's merged values (see the module docstring)."""
    t = op.table
    if t.dropped:
        return
    index, seq, rollouts = t.index, op.seq, t.rollouts
    t.pending.settle([it.key for it in op.items], itertools.repeat(seq))
    for it in op.items:
        key = it.key
        slot = index.get(key)
        if slot is None:  # trimmed meanwhile
            continue
        value = it.value
        size = len(value) + len(key)
        t.patch_value(slot, value, size)  # a value read from RocksDB before this is stale
        # put_seq stays the push's: a checkpoint that stops at a position between the push
        # and this patch must still write the item (the log it cuts holds the push), and a
        # replayed patch only sets again the values written
        state.ledger.add(t, slot, cache_charge(size))
        rollouts.on_patch(slot, value)
        if it.tags is not None:
            rollouts.set_tags(slot, it.tags)
    t.pending.applied(seq, op.weight)
    rollouts.changed.notify()


def apply_ack(op: AckOp) -> None:
    """Record that a task consumed items (their metadata then saves it)."""
    t = op.table
    if not t.dropped:
        index_get = t.index.get
        slots = [slot for key in op.keys if (slot := index_get(key)) is not None]
        t.rollouts.on_ack(op.task, slots)
    t.pending.applied(op.seq, op.weight)


def apply_version(op: VersionOp) -> None:
    """Move the table's policy version forward (never back)."""
    t = op.table
    if not t.dropped:
        t.rollouts.version = max(t.rollouts.version, op.version)
    t.pending.applied(op.seq, op.weight)
