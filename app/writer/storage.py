"""Storage modes: where a table's values live and how what the writer applied is made
durable, chosen once at start from ``--storage-mode``.

::

    Storage              open and load, checkpoint, capture (for a snapshot), close
    ├── MemoryStorage    values in the cache only; a checkpoint writes the tables to
    │                    ``memory.ckpt``; the cache limit is a hard cap
    └── RocksStorage     values in RocksDB too, behind the cache
        ├── HybridStorage  a write-back cache: pushes stay in the cache until a checkpoint
        │                  or an eviction writes them
        └── DiskStorage    pushes are written through to RocksDB at once

The writer (:mod:`rlreplay.app.writer.apply`, :mod:`rlreplay.app.writer.checkpoints`) asks the
storage what to do (:attr:`Storage.caches_pushes`, :attr:`Storage.evicts`, :attr:`Storage.capped`)
instead of comparing mode names, and a RocksDB-backed storage keeps the writes that a failed
RocksDB call put off, for the next checkpoint's batch.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import msgpack
import numpy as np

from rlreplay.app.episodes.persistence import load_blob, load_rocks, rocks_writes
from rlreplay.app.storage import layout
from rlreplay.app.storage.faults import StorageDamaged
from rlreplay.app.storage.layout import (
    LSN_KEY,
    REQUEST_IDS_KEY,
    meta_key,
    pack_count,
    table_key,
    value_key,
)
from rlreplay.app.storage.rocks import RocksStore
from rlreplay.app.storage.salvage import salvage_rocksdb
from rlreplay.app.tables.items import index_fields_of
from rlreplay.app.tables.table import Table
from rlreplay.app.writer.memory_checkpoint import (
    MEMORY_CHECKPOINT,
    read_checkpoint_file,
    write_checkpoint_file,
)
from rlreplay.app.writer.state import EngineState, cache_charge, meta_bytes, table_record
from rlreplay.workers.blocking import BlockingIO

__all__ = [
    "DiskStorage",
    "HybridStorage",
    "MemoryStorage",
    "RocksStorage",
    "Storage",
    "storage_for",
]

_FLUSH_YIELD_EVERY = 4096  # slots a checkpoint visits between turns given to the event loop


class Storage(ABC):
    """One storage mode (see the module docstring); every method but :meth:`close` is
    called by the writer or, before it starts, by recovery."""

    #: The ``--storage-mode`` it implements.
    mode: ClassVar[str]
    #: A push's values go into the cache (memory, hybrid); else straight to RocksDB (disk).
    caches_pushes: ClassVar[bool] = True
    #: Values leave the cache for RocksDB when it is past its limit (disk, hybrid).
    evicts: ClassVar[bool] = True
    #: The cache limit is a hard cap: a push past it is refused (memory).
    capped: ClassVar[bool] = False
    #: Checkpoints run without the log too (memory mode's are read back only with it).
    checkpoints_without_log: ClassVar[bool] = True
    #: :meth:`capture` reads what a full :meth:`checkpoint` just wrote (RocksDB).
    captures_after_checkpoint: ClassVar[bool] = True

    #: The RocksDB database (None in memory mode).
    store: RocksStore | None = None

    @abstractmethod
    async def open(self, state: EngineState, *, restored: bool = False) -> int:
        """Open what lives in the data directory and load its tables into ``state``;
        returns the log position they cover. ``restored``: a snapshot was just put there."""

    def cut(self, covered: int, horizon: int, *, full: bool, logged: bool) -> int:
        """The log position a checkpoint makes durable, ``covered`` being the last op
        applied and ``horizon`` the position the previous checkpoint covered.

        With the log on, and unless ``full``, only the values logged before the previous
        checkpoint are written, and the log is cut there: a value pushed since stays in the
        cache and the log only, so in a bounded table the many values evicted (or
        replaced) within a checkpoint interval of being pushed are never written.
        """
        return covered if full or not logged else min(horizon, covered)

    @abstractmethod
    async def checkpoint(self, state: EngineState, covered: int, upto: int) -> None:
        """Make durable what the writer applied: everything up to ``covered`` (memory), or
        the values logged up to ``upto`` and the metadata that goes with them (RocksDB)."""

    @abstractmethod
    async def capture(self, state: EngineState, dest: Path, covered: int) -> None:
        """Copy every table, as of log position ``covered``, into the folder ``dest`` as a
        data directory a server can start from (after a full :meth:`checkpoint`)."""

    async def close(self, io: BlockingIO) -> None:  # noqa: B027 - memory mode holds nothing
        """Let go of the data directory; idempotent."""


class MemoryStorage(Storage):
    """Values live in the cache alone, which is a hard cap; a checkpoint writes the tables
    to ``memory.ckpt`` (with the log on: without it there is nothing to bound), leaving out
    the items pushed since the previous checkpoint, which the log holds."""

    mode = "memory"
    evicts = False
    capped = True
    checkpoints_without_log = False
    captures_after_checkpoint = False

    async def open(self, state: EngineState, *, restored: bool = False) -> int:
        st = state.settings
        path = st.data_dir / MEMORY_CHECKPOINT
        if not ((st.durability == "wal" or restored) and path.exists()):
            return 0

        def load() -> tuple[dict[str, Any] | None, list[Table]]:
            """The checkpoint's tables, their items restored (in an I/O thread); a damaged
            file raises, unless the start accepts data loss (then: what is whole in it)."""
            header, rows = read_checkpoint_file(path, state.data_loss)
            if header is None:
                return None, []
            by_tid: dict[int, list[tuple[Any, ...]]] = {}
            episode_blobs: dict[int, list[bytes]] = {}
            for tid, key, value, prio, ts, sampled, order, *meta in rows:
                if key is None:  # an episode table's state or one of its episodes
                    episode_blobs.setdefault(tid, []).append(value)
                    continue
                by_tid.setdefault(tid, []).append(
                    (key, value, prio, ts, sampled, len(value) + len(key), order, *meta)
                )
            tables = []
            for spec in header["tables"]:
                table = Table.from_state_dict(spec["name"], spec)
                mine = by_tid.get(table.tid, [])
                fields = (
                    [index_fields_of(r[1], table.index_fields) for r in mine]
                    if table.index_fields
                    else []
                )
                restore_rows(state, table, mine, on_disk=False, fields=fields)
                if table.episodes is not None:
                    for blob in episode_blobs.get(table.tid, []):
                        load_blob(table.episodes, blob)
                tables.append(table)
            return header, tables

        header, tables = await state.io.run(load)
        if header is None:  # its header was lost, and the start accepts it
            return 0
        for table in tables:
            state.tables[table.name] = table
        state.next_tid = int(header["next_tid"])
        state.request_ids.load(header.get("request_ids", []))
        return int(header["lsn"])

    async def checkpoint(self, state: EngineState, covered: int, upto: int) -> None:
        """Write the items whose value was logged up to ``upto``, as they are now; the log
        from ``upto`` on, which a restart replays, holds the others (see :meth:`cut`)."""
        await self._write(state, upto, state.settings.data_dir / MEMORY_CHECKPOINT)

    async def capture(self, state: EngineState, dest: Path, covered: int) -> None:
        await self._write(state, covered, dest / MEMORY_CHECKPOINT)

    @staticmethod
    async def _write(state: EngineState, upto: int, path: Path) -> None:
        """Write the tables to ``path``, off the event loop (the writer waits)."""
        header = {
            "lsn": upto,
            "next_tid": state.next_tid,
            "tables": [{"name": t.name, **t.state_dict()} for t in state.tables.values()],
            "request_ids": state.request_ids.state(),
        }
        tables = list(state.tables.values())
        await state.io.run(write_checkpoint_file, path, header, tables, upto)


class RocksStorage(Storage):
    """Values live in RocksDB behind the cache (the base of hybrid and disk modes).

    It also keeps the RocksDB writes put off until the next checkpoint's batch: deletes
    queued by the writer, and table records and range deletes a failed write left over.
    """

    def __init__(self) -> None:
        self.store: RocksStore | None = None
        #: Keys to delete, written with the next batch that goes to RocksDB.
        self.deletes: list[bytes] = []
        #: Puts and range deletes a failed write put off to the next checkpoint.
        self.deferred_puts: list[tuple[bytes, bytes]] = []
        self.deferred_ranges: list[tuple[bytes, bytes]] = []

    @property
    def db(self) -> RocksStore:
        """The open database."""
        assert self.store is not None, "the storage is not open"
        return self.store

    def take_deletes(self) -> list[bytes]:
        """The queued deletes, handed over to a write (give them back if it fails)."""
        out, self.deletes = self.deletes, []
        return out

    def give_back_deletes(self, deletes: list[bytes]) -> None:
        """Queue again, first, the deletes of a write that failed."""
        self.deletes[:0] = deletes

    async def open(self, state: EngineState, *, restored: bool = False) -> int:
        """Open RocksDB, which reads every block once (so damage stops the start, naming the
        file, rather than being served); with ``--accept-data-loss``, a damaged database is
        salvaged (:mod:`rlreplay.app.storage.salvage`) and the log replayed on top."""
        try:
            return await self._open(state)
        except StorageDamaged as exc:
            state.data_loss.found("checkpoint_damaged", str(exc))  # raises unless accepted
        if self.store is not None:
            await self.close(state.io)
            self.store = None
        await state.io.run(salvage_rocksdb, state.settings.data_dir / "rocksdb")
        return await self._open(state)

    async def _open(self, state: EngineState) -> int:
        self.store = store = await state.io.run(RocksStore, state.settings.data_dir / "rocksdb")

        def load() -> tuple[int, int, list[Table]]:
            """The tables RocksDB holds, their items restored (in an I/O thread: a big
            table takes seconds, and the event loop answers probes meanwhile)."""
            tables = []
            for key, value in store.scan(b"t"):
                table = Table.from_state_dict(key[1:].decode(), msgpack.unpackb(value, raw=False))
                rows = []
                fields: list[dict[str, Any]] = []
                for raw_key, raw_meta in store.scan(b"m" + layout.table_id(table.tid)):
                    prio, ts, sampled, size, order, indexed, rollout = layout.unpack_meta(raw_meta)
                    item_key = layout.item_key_of(raw_key)
                    rows.append((item_key, None, prio, ts, sampled, size, order, rollout))
                    if table.index_fields:
                        fields.append(indexed)
                restore_rows(state, table, rows, on_disk=True, fields=fields)
                if table.episodes is not None:
                    load_rocks(table.episodes, table.prefix, store)
                tables.append(table)
            ids = store.get(layout.REQUEST_IDS_KEY)
            state.request_ids.load(msgpack.unpackb(ids, raw=False) if ids else [])
            return (
                layout.unpack_count(store.get(layout.LSN_KEY), 0),
                layout.unpack_count(store.get(layout.NEXT_TID_KEY), 1),
                tables,
            )

        covered, next_tid, tables = await state.io.run(load)
        state.next_tid = next_tid
        for table in tables:
            state.tables[table.name] = table
            state.next_tid = max(state.next_tid, table.tid + 1)
        return int(covered)

    async def checkpoint(self, state: EngineState, covered: int, upto: int) -> None:
        """Write the changed values of ops up to ``upto`` and the changed metadata of the
        items whose value RocksDB then holds; then flush RocksDB's memtables.

        Only the changed slots are visited (found with numpy), and their flags are cleared
        before the write: a sample that changes a slot meanwhile marks it again. A value
        logged after ``upto`` stays dirty, and so does its metadata (its record would
        not match the value RocksDB holds). A write that fails sets the flags back and
        raises: nothing of the batch was written, and the next checkpoint writes it.
        """
        store = self.db
        puts: list[tuple[bytes, bytes]] = list(self.deferred_puts)
        ranges = list(self.deferred_ranges)
        # what the visit clears, to set again if the write fails: (table, slot, value
        # written, its old on_disk, its old disk_size)
        cleared: list[tuple[Table, int, bool, int, int]] = []
        for t in state.tables.values():
            n = len(t.keys)
            dirty = np.frombuffer(t.dirty, dtype=np.uint8, count=n)
            changed = np.flatnonzero(dirty | t.meta_dirty[:n])
            changed = changed[(dirty[changed] == 0) | (t.put_seq[changed] <= upto)]
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
                puts.append((meta_key(t.prefix, key), meta_bytes(t, slot)))
                t.mark_checkpointed(slot, wrote=wrote)
        # each table's own state (rate limiter counts, counters) as of this checkpoint
        puts.extend((table_key(t.name), table_record(t)) for t in state.tables.values())
        # episode tables: their episodes' records and the chunks sealed since
        episode_writes = [
            rocks_writes(t.episodes, t.prefix) for t in state.tables.values() if t.episodes
        ]
        for e_puts, e_deletes, _ in episode_writes:
            puts.extend(e_puts)
            self.deletes.extend(e_deletes)
        ids = await state.io.run(msgpack.packb, state.request_ids.state())  # up to ~10 MB
        puts.append((REQUEST_IDS_KEY, ids))
        puts.append((LSN_KEY, pack_count(upto)))
        deletes = self.take_deletes()
        try:
            if store.failure is not None:
                await state.io.run(store.recover)
            await state.io.run(store.write, puts, deletes, ranges)
        except OSError:  # nothing of the batch was written: the next checkpoint writes it
            self.give_back_deletes(deletes)  # episodes' deletes among them
            for t, slot, wrote, on_disk, disk_size in cleared:
                if t.keys[slot] is None:
                    continue
                t.unmark_checkpointed(slot, wrote=wrote, on_disk=on_disk, disk_size=disk_size)
            raise
        self.deferred_puts, self.deferred_ranges = [], []
        for _, _, written in episode_writes:
            written()
        await state.io.run(store.flush)  # if it fails, the log is not cut: it still covers all

    async def capture(self, state: EngineState, dest: Path, covered: int) -> None:
        """RocksDB's checkpoint into ``dest/rocksdb``: hard links to its immutable files,
        which the upload then reads while the writer goes on."""
        await state.io.run(self.db.checkpoint_to, dest / "rocksdb")

    async def close(self, io: BlockingIO) -> None:
        if self.store is not None:
            await io.run(self.store.close)


class HybridStorage(RocksStorage):
    """A write-back cache over RocksDB: pushes stay in the cache until a checkpoint (or an
    eviction) writes them; values evicted or replaced in between never reach RocksDB."""

    mode = "hybrid"


class DiskStorage(RocksStorage):
    """Pushes are written through to RocksDB at once; the cache holds values read back."""

    mode = "disk"
    caches_pushes = False


def storage_for(mode: str) -> Storage:
    """The storage of ``--storage-mode`` ``mode``."""
    kinds: dict[str, type[Storage]] = {
        "memory": MemoryStorage,
        "hybrid": HybridStorage,
        "disk": DiskStorage,
    }
    try:
        return kinds[mode]()
    except KeyError:
        raise ValueError(f"storage mode {mode!r} must be one of {sorted(kinds)}") from None


# -- what loading and checkpoints share with the writer -------------------------------------


def restore_rows(
    state: EngineState,
    table: Table,
    rows: list[tuple[Any, ...]],
    *,
    on_disk: bool,
    fields: list[dict[str, Any]],
) -> None:
    """Load recovered items into ``table`` (see :meth:`Table.restore`) and charge the cache
    ledger for the values it now holds."""
    cached, sizes = table.restore(rows, on_disk=on_disk, fields=fields)
    if cached:
        state.ledger.add_many(table, cached, [cache_charge(size) for size in sizes])
