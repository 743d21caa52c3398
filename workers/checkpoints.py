"""Checkpoints: what the writer applied is made durable without the log, then the log it
covers is cut.

Memory mode writes every table to its checkpoint file. Hybrid and disk modes write the
changed values and metadata to RocksDB; a checkpoint that fails (a full disk) sets its
flags back and does not cut the log, and the writer tries again with backoff.
"""

from __future__ import annotations

import asyncio

import numpy as np

from rlreplay.app.storage.layout import LSN_KEY, meta_key, pack_count, table_key, value_key
from rlreplay.app.tables.table import Table
from rlreplay.workers.apply import OpApplier
from rlreplay.workers.memory_checkpoint import MEMORY_CHECKPOINT, write_checkpoint_file
from rlreplay.workers.state import (
    meta_bytes,
    table_record,
)

_FLUSH_YIELD_EVERY = 4096  # slots a checkpoint visits between turns given to the event loop


class Checkpointer(OpApplier):
    """The writer's checkpoints (a base of the task processor)."""

    async def checkpoint(self, *, full: bool = False) -> None:
        """Make what is applied durable without the log, then drop the log it covers.

        Memory mode writes every table to its checkpoint file. Hybrid and disk modes write
        the changed values and metadata to RocksDB, but with the log on and unless ``full``,
        only those of values logged before the previous checkpoint, and the log is cut
        there: a value pushed since stays in the cache and the log only, so in a bounded
        table the many values evicted (or replaced) within a checkpoint interval of being
        pushed are never written to RocksDB, nor deleted from it. The log then holds up to
        about three intervals (two, and the segment the cut falls in: about
        ``3 x wal_checkpoint_mb``), and a restart replays them.
        """
        s = self._state
        wal = s.wal
        if wal is None and s.mode == "memory":
            return
        if wal is not None:
            await wal.rotate()
        oldest = self.oldest_queued_seq()
        covered = (oldest - 1) if oldest is not None else s.seq
        if s.mode == "memory":
            await self._write_memory_checkpoint(covered)
            upto = covered
        else:
            upto = covered if full or wal is None else min(self.horizon, covered)
            await self._flush_dirty(upto)
        self.horizon = covered
        if wal is not None:
            await wal.truncate(upto)

    async def _flush_dirty(self, covered: int) -> None:
        """Write the changed values of ops up to ``covered`` and the changed metadata of the
        items whose value RocksDB then holds; then flush RocksDB's memtables.

        Only the changed slots are visited (found with numpy), and their flags are cleared
        before the write: a sample that changes a slot meanwhile marks it again. A value
        logged after ``covered`` stays dirty, and so does its metadata (its record would
        not match the value RocksDB holds).
        """
        s = self._state
        assert s.store is not None
        puts: list[tuple[bytes, bytes]] = list(self._deferred_puts)
        ranges = list(self._deferred_ranges)
        # what the visit clears, to set again if the write fails: (table, slot, value
        # written, its old on_disk, its old disk_size)
        cleared: list[tuple[Table, int, bool, int, int]] = []
        for t in s.tables.values():
            n = len(t.keys)
            dirty = np.frombuffer(t.dirty, dtype=np.uint8, count=n)
            changed = np.flatnonzero(dirty | t.meta_dirty[:n])
            changed = changed[(dirty[changed] == 0) | (t.put_seq[changed] <= covered)]
            del dirty
            for i, slot in enumerate(changed.tolist()):
                if i % _FLUSH_YIELD_EVERY == _FLUSH_YIELD_EVERY - 1:
                    # let requests through: only this writer changes keys and values, and
                    # a sample that marks a slot meanwhile marks it for the next checkpoint
                    await asyncio.sleep(0)
                key = t.keys[slot]
                if key is None:
                    continue
                wrote = bool(t.dirty[slot])
                cleared.append((t, slot, wrote, t.on_disk[slot], int(t.disk_size[slot])))
                if wrote:
                    value = t.values[slot]
                    assert value is not None
                    puts.append((value_key(t.prefix, key), value))
                    size = int(t.size[slot])
                    t.bytes_on_disk += size - int(t.disk_size[slot])
                    t.disk_size[slot] = size
                    t.on_disk[slot] = 1
                    t.dirty[slot] = 0
                puts.append((meta_key(t.prefix, key), meta_bytes(t, slot)))
                t.meta_dirty[slot] = 0
        # each table's own state (rate limiter counts, counters) as of this checkpoint
        puts.extend((table_key(t.name), table_record(t)) for t in s.tables.values())
        puts.append((LSN_KEY, pack_count(covered)))
        deletes = self._take_disk_deletes()
        try:
            if s.store.failure is not None:
                await s.io.run(s.store.recover)
            await s.io.run(s.store.write, puts, deletes, ranges)
        except OSError:  # nothing of the batch was written: the next checkpoint writes it
            self._disk_deletes[:0] = deletes
            for t, slot, wrote, on_disk, disk_size in cleared:
                if t.keys[slot] is None:
                    continue
                t.meta_dirty[slot] = 1
                if wrote:
                    t.bytes_on_disk += disk_size - int(t.disk_size[slot])
                    t.dirty[slot], t.on_disk[slot], t.disk_size[slot] = 1, on_disk, disk_size
            raise
        self._deferred_puts, self._deferred_ranges = [], []
        await s.io.run(s.store.flush)  # if it fails, the log is not cut: it still covers all

    async def _write_memory_checkpoint(self, covered: int) -> None:
        """Write every table to the snapshot file, off the event loop (the writer waits)."""
        s = self._state
        header = {
            "lsn": covered,
            "next_tid": s.next_tid,
            "tables": [{"name": t.name, **t.state_dict()} for t in s.tables.values()],
        }
        await s.io.run(
            write_checkpoint_file,
            s.settings.data_dir / MEMORY_CHECKPOINT,
            header,
            list(s.tables.values()),
        )
