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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import msgpack
import numpy as np

from rlreplay.app.episodes.persistence import load_blob, load_rocks, rocks_writes
from rlreplay.app.storage import layout
from rlreplay.app.storage.faults import StorageDamaged
from rlreplay.app.storage.layout import (
    LSN_KEY,
    REPLAY_RATE_KEY,
    REQUEST_IDS_KEY,
    meta_keys,
    pack_count,
    table_key,
    value_keys,
)
from rlreplay.app.storage.rocks import RocksStore
from rlreplay.app.storage.salvage import salvage_rocksdb
from rlreplay.app.tables.items import index_fields_of
from rlreplay.app.tables.table import Table
from rlreplay.app.writer.checkpoint_writes import STEP_BYTES, STEP_SLOTS, CheckpointWrites
from rlreplay.app.writer.memory_checkpoint import (
    MEMORY_CHECKPOINT,
    capture_rows,
    read_checkpoint_file,
    write_checkpoint_file,
)
from rlreplay.app.writer.state import EngineState, cache_charge, meta_records, table_record
from rlreplay.app.writer.window_keys import load_window, save_window
from rlreplay.workers.blocking import BlockingIO

__all__ = [
    "DiskStorage",
    "HybridStorage",
    "MemoryStorage",
    "RocksStorage",
    "Storage",
    "storage_for",
]

#: Bytes of values a step writes: RocksDB holds the GIL for about 0.5 ms (2 ms at the 99th
#: percentile) for 1 MiB here. Each step waits for a turn of a busy event loop (several
#: milliseconds under a full push load), so the step's size sets how fast a checkpoint
#: goes: 256 KiB steps made checkpoints twice as long (``bench.ingest``).
#: How long memory mode's checkpoint waits for its file before applying pushes again.
_WRITING_POLL_S = 0.002

#: What a checkpoint runs between its steps (the writer applying the pushes queued).
BetweenSteps = Callable[[], Awaitable[None]]


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
    #: The log's replay rate (bytes a second) that a start measured on this data, saved
    #: with each checkpoint and loaded by :meth:`open` (0.0: none measured yet; a
    #: snapshot just restored, from another machine perhaps, brings none).
    replay_bytes_s: float = 0.0

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

    def first_unwritten(self, state: EngineState) -> int | None:
        """The log position of the oldest value that only the cache and the log hold (which
        a checkpoint would write), or None: a checkpoint may cut the log below it instead
        (:meth:`~rlreplay.app.writer.checkpoints.Checkpointer.checkpoint`). None here:
        memory mode writes every item it keeps."""
        return None

    @abstractmethod
    async def checkpoint(
        self, state: EngineState, covered: int, upto: int, between: BetweenSteps | None = None
    ) -> int:
        """Make durable what the writer applied: everything up to ``covered`` (memory), or
        the values logged up to ``upto`` and the metadata that goes with them (RocksDB);
        returns the bytes written. ``between``: what may run between the checkpoint's
        steps (RocksDB's) or while its file is written (memory mode's)."""

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
        if not restored:
            self.replay_bytes_s = float(header.get("replay_bytes_s", 0.0))
        return int(header["lsn"])

    async def checkpoint(
        self, state: EngineState, covered: int, upto: int, between: BetweenSteps | None = None
    ) -> int:
        """Write the items whose value was logged up to ``upto``, as they are now; the log
        from ``upto`` on, which a restart replays, holds the others (see :meth:`cut`).

        The tables are captured on the event loop (copies of their columns), and the file
        is written from the capture in an I/O thread while ``between`` runs again and again
        (the writer applies the pushes that come in): what it changes meanwhile was logged
        after ``covered``, which the log keeps."""
        path = state.settings.data_dir / MEMORY_CHECKPOINT
        await self._write(state, upto, path, between)
        return (await state.io.run(path.stat)).st_size

    async def capture(self, state: EngineState, dest: Path, covered: int) -> None:
        await self._write(state, covered, dest / MEMORY_CHECKPOINT)

    async def _write(
        self, state: EngineState, upto: int, path: Path, between: BetweenSteps | None = None
    ) -> None:
        """Write the tables to ``path`` as they are now, off the event loop; without
        ``between`` the writer waits for the file."""
        header = {
            "lsn": upto,
            "next_tid": state.next_tid,
            "tables": [{"name": t.name, **t.state_dict()} for t in state.tables.values()],
            "request_ids": state.request_ids.snapshot(),  # packed with the file
            "replay_bytes_s": self.replay_bytes_s,
        }
        tables = await capture_rows(list(state.tables.values()), upto)
        written = asyncio.ensure_future(state.io.run(write_checkpoint_file, path, header, tables))
        if between is None:
            await written
            return
        try:
            while not written.done():
                await between()
                await asyncio.wait((written,), timeout=_WRITING_POLL_S)
        except BaseException:
            # the thread finishes the file (or removes it) on its own; its error is moot
            written.add_done_callback(_forget)
            raise
        written.result()


def _forget(future: asyncio.Future[None]) -> None:
    """Retrieve the outcome of a write no one waits for any longer."""
    if not future.cancelled():
        future.exception()


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
        #: Whether RocksDB holds the idempotency window as one value (as earlier versions
        #: wrote it), which the next checkpoint deletes (:mod:`~rlreplay.app.writer.window_keys`).
        self.window_in_one_value = False

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

    def first_unwritten(self, state: EngineState) -> int | None:
        """The push position of the oldest value RocksDB does not hold (a dirty slot)."""
        oldest: int | None = None
        for t in state.tables.values():
            n = len(t.keys)
            if t.dropped or not n:
                continue
            dirty = np.frombuffer(t.dirty, dtype=np.uint8, count=n)
            seqs = t.put_seq[:n][dirty != 0]
            if len(seqs):
                low = int(seqs.min())
                oldest = low if oldest is None else min(oldest, low)
        return oldest

    async def write_in_steps(
        self,
        io: BlockingIO,
        puts: Sequence[tuple[bytes, bytes]],
        deletes: Sequence[bytes] = (),
        ranges: Sequence[tuple[bytes, bytes]] = (),
        *,
        step_bytes: int = STEP_BYTES,
    ) -> None:
        """The writer's writes outside checkpoints (evictions, deletes, write-through),
        in the checkpoint's steps (of ``step_bytes`` of values): none holds the GIL for
        long, or through a flush."""
        await CheckpointWrites(self.db, io).write(puts, deletes, ranges, step_bytes=step_bytes)

    async def open(self, state: EngineState, *, restored: bool = False) -> int:
        """Open RocksDB, which reads every block once (so damage stops the start, naming the
        file, rather than being served); with ``--accept-data-loss``, a damaged database is
        salvaged (:mod:`rlreplay.app.storage.salvage`) and the log replayed on top."""
        try:
            return await self._open(state, restored)
        except StorageDamaged as exc:
            state.data_loss.found("checkpoint_damaged", str(exc))  # raises unless accepted
        if self.store is not None:
            await self.close(state.io)
            self.store = None
        await state.io.run(salvage_rocksdb, state.settings.data_dir / "rocksdb")
        return await self._open(state, restored)

    async def _open(self, state: EngineState, restored: bool) -> int:
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
            self.window_in_one_value = load_window(store, state.request_ids)
            return (
                layout.unpack_count(store.get(layout.LSN_KEY), 0),
                layout.unpack_count(store.get(layout.NEXT_TID_KEY), 1),
                tables,
            )

        covered, next_tid, tables = await state.io.run(load)
        if not restored:
            self.replay_bytes_s = layout.unpack_rate(await state.io.run(store.get, REPLAY_RATE_KEY))
        state.next_tid = next_tid
        for table in tables:
            state.tables[table.name] = table
            state.next_tid = max(state.next_tid, table.tid + 1)
        return int(covered)

    async def checkpoint(
        self, state: EngineState, covered: int, upto: int, between: BetweenSteps | None = None
    ) -> int:
        """Write the changed values of ops up to ``upto`` and the changed metadata of the
        items whose value RocksDB then holds; then flush RocksDB's memtables. Returns the
        bytes written.

        Only the changed slots are visited (found with numpy), what the table's remover
        takes first last (:func:`_removed_last`), in steps of about
        :data:`STEP_BYTES`: each step's slots are visited on the event loop, their flags
        cleared (a sample that changes a slot meanwhile marks it again), and written as
        one batch in an I/O thread, which holds the GIL for a millisecond or two
        (rocksdict holds it through a write); a write RocksDB would make wait for a
        flush is tried again a few milliseconds later instead. Between steps,
        ``between`` runs (the writer applies the pushes that came in meanwhile): a slot
        is looked at again when its step comes. A value logged after ``upto`` stays
        dirty, and so does its metadata (its record would not match the value RocksDB
        holds). Then the request ids answered and dropped since the last checkpoint
        (:func:`~rlreplay.app.writer.window_keys.save_window`); the table records and the
        log position go last: RocksDB, which keeps no WAL of its own here, persists its
        writes in order, so a position found on disk covers every step before it.

        A step that fails sets its flags back and raises: the steps before it are
        written (RocksDB's recovery keeps them), the position is not, so the log is
        not cut and the next checkpoint writes the rest.
        """
        store, io = self.db, state.io
        steps = CheckpointWrites(store, io)
        if store.failure is not None:
            await io.run(store.recover)
        # first the writes put off, and the queued deletes: before any put of this
        # checkpoint, as in the writer's order (a key deleted, then pushed again)
        deletes = self.take_deletes()
        try:
            await steps.write(self.deferred_puts, deletes, self.deferred_ranges)
        except OSError:
            self.give_back_deletes(deletes)
            raise
        self.deferred_puts, self.deferred_ranges = [], []
        for t in list(state.tables.values()):
            n = len(t.keys)
            dirty = np.frombuffer(t.dirty, dtype=np.uint8, count=n)
            found = np.flatnonzero(dirty | t.meta_dirty[:n])
            found = found[(dirty[found] == 0) | (t.put_seq[found] <= upto)]
            del dirty
            changed = await _removed_last(io, t, found)
            at = 0
            while at < len(changed) and not t.dropped:
                at = await self._step(t, changed, at, upto, steps)
                if between is not None:
                    await between()
        # the idempotency window: the ids answered and dropped since the last checkpoint
        changes = state.request_ids.take_changes()
        try:
            await save_window(state.request_ids, changes, steps, between)
        except BaseException:
            state.request_ids.give_back(changes)
            raise
        # each table's own state (rate limiter counts, counters) as of this checkpoint
        puts = [(table_key(t.name), table_record(t)) for t in state.tables.values()]
        # episode tables: their episodes' records and the chunks sealed since
        episode_writes = [
            rocks_writes(t.episodes, t.prefix) for t in state.tables.values() if t.episodes
        ]
        for e_puts, e_deletes, _ in episode_writes:
            puts.extend(e_puts)
            self.deletes.extend(e_deletes)
        if self.window_in_one_value:  # as earlier versions saved it: now in keys
            self.deletes.append(REQUEST_IDS_KEY)
        if self.replay_bytes_s:
            puts.append((REPLAY_RATE_KEY, layout.pack_rate(self.replay_bytes_s)))
        puts.append((LSN_KEY, pack_count(upto)))
        deletes = self.take_deletes()
        try:
            await steps.write(puts, deletes, [])
        except OSError:
            self.give_back_deletes(deletes)  # episodes' deletes among them
            raise
        for _, _, written in episode_writes:
            written()
        self.window_in_one_value = False
        await io.run(store.flush)  # if it fails, the log is not cut: it still covers all
        return steps.bytes

    @staticmethod
    async def _step(
        t: Table, changed: np.ndarray, at: int, upto: int, steps: CheckpointWrites
    ) -> int:
        """Visit ``changed[at:]`` until a step's worth of bytes, and write them; returns
        where the next step starts. The visit reads the table's columns for the step's
        slots at once (flags, then the metadata records: :func:`meta_records`)."""
        slots = changed[at : at + STEP_SLOTS]
        keys = t.keys
        n = len(keys)
        wrote = np.frombuffer(t.dirty, dtype=np.uint8, count=n)[slots] != 0
        # written (by an eviction) since the visit began, or logged after the cut (the
        # log keeps it): not written
        take = (wrote | (t.meta_dirty[slots] != 0)) & ~(wrote & (t.put_seq[slots] > upto))
        wrote &= take
        # the step ends with the value that takes it past STEP_BYTES
        past = np.flatnonzero(np.cumsum(np.where(wrote, t.size[slots], 0)) >= STEP_BYTES)
        end = int(past[0]) + 1 if len(past) else len(slots)
        taken, wrote = slots[:end][take[:end]], wrote[:end][take[:end]]
        # and gone (its key): not written
        live = np.fromiter((keys[s] is not None for s in taken.tolist()), bool, len(taken))
        if not live.all():
            taken, wrote = taken[live], wrote[live]
        taken_list, wrote_list = taken.tolist(), wrote.tolist()
        # every taken slot has a key (live), and a value where it is written (dirty)
        taken_keys = [k for s in taken_list if (k := keys[s]) is not None]
        values = t.values
        puts: list[tuple[bytes, bytes]] = [
            (k, v)
            for k, s in zip(
                value_keys(t.prefix, [k for k, w in zip(taken_keys, wrote_list, strict=True) if w]),
                taken[wrote].tolist(),
                strict=True,
            )
            if (v := values[s]) is not None
        ]
        puts.extend(zip(meta_keys(t.prefix, taken_keys), meta_records(t, taken), strict=True))
        # what the visit clears, to set again if the write fails
        on_disk = np.frombuffer(t.on_disk, dtype=np.uint8, count=n)[taken]
        disk_size = t.disk_size[taken]
        t.mark_checkpointed(taken, wrote)
        try:
            await steps.write_batch(puts)
        except OSError:  # nothing of this step was written: the next checkpoint writes it
            for slot, w, old_on_disk, old_size in zip(
                taken_list, wrote_list, on_disk.tolist(), disk_size.tolist(), strict=True
            ):
                if t.keys[slot] is not None:
                    t.unmark_checkpointed(slot, wrote=w, on_disk=old_on_disk, disk_size=old_size)
            raise
        return at + end

    async def capture(self, state: EngineState, dest: Path, covered: int) -> None:
        """RocksDB's checkpoint into ``dest/rocksdb``: hard links to its immutable files,
        which the upload then reads while the writer goes on."""
        await state.io.run(self.db.checkpoint_to, dest / "rocksdb")

    async def close(self, io: BlockingIO) -> None:
        if self.store is not None:
            await io.run(self.store.close)


async def _removed_last(io: BlockingIO, t: Table, slots: np.ndarray) -> np.ndarray:
    """``slots`` in the order a checkpoint visits them: what the table's remover takes
    first comes last (a FIFO table's oldest items), so that many of those are removed
    before their step comes and are never written. Sorted in an I/O thread (numpy lets
    go of the GIL): a table of 200,000 takes about 10 ms."""
    kind = t.config.remover.type
    if t.config.max_size is None or len(slots) < 2 or kind not in _REMOVER_KEYS:
        return slots
    column, descending = _REMOVER_KEYS[kind]
    key = (t.order if column == "order" else t.priority)[slots]
    return await io.run(_sorted_by, slots, key, descending)


#: Remover -> (the column it removes by, whether the checkpoint visits it descending):
#: the items the remover takes first are visited last.
_REMOVER_KEYS = {
    "fifo": ("order", True),
    "lifo": ("order", False),
    "min_heap": ("priority", True),
    "max_heap": ("priority", False),
}


def _sorted_by(slots: np.ndarray, key: np.ndarray, descending: bool) -> np.ndarray:
    """``slots`` sorted by ``key``."""
    order = np.argsort(key, kind="stable")
    return slots[order[::-1] if descending else order]


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
