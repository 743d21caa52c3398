"""Applying ops to tables and storage, evicting, and checkpointing: what the writer does.

Only :class:`~rlreplay.app.writer.task_processor.TaskProcessor`, which owns the writer task and its
queues and holds an :class:`OpApplier`, calls these, one op at a time (recovery, through it,
calls :meth:`OpApplier.apply` to replay the log). Storage errors in background work
(checkpoints, evictions) are logged, counted and retried with backoff; a write an op cannot
do without is put off to the next checkpoint.
"""

from __future__ import annotations

import itertools
import logging
import operator
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol, cast

import numpy as np

from rlreplay.app.episodes.chunk_residency import ChunkResidency
from rlreplay.app.storage.allocator import release_free_memory
from rlreplay.app.storage.cache import ENTRY_OVERHEAD
from rlreplay.app.storage.faults import Backoff, storage_error
from rlreplay.app.storage.layout import (
    NEXT_TID_KEY,
    meta_key,
    pack_count,
    table_key,
    table_ranges,
    value_key,
)
from rlreplay.app.tables.items import index_fields_of
from rlreplay.app.tables.table import Table
from rlreplay.app.writer.checkpoint_writes import STEP_SLOTS
from rlreplay.app.writer.checkpoints import Checkpointer
from rlreplay.app.writer.episodes import (
    apply_episode_append,
    apply_episode_delete,
    apply_episode_priorities,
    chunk_puts,
    chunks_evicted,
    chunks_kept,
)
from rlreplay.app.writer.ops import (
    AckOp,
    CheckpointOp,
    CreateTableOp,
    DeleteOp,
    DropTableOp,
    EpisodeAppendOp,
    EpisodeDeleteOp,
    EpisodePriorityOp,
    EvictOp,
    Op,
    PatchOp,
    PopulateOp,
    PriorityOp,
    PutOp,
    SnapshotOp,
    VersionOp,
    queued_ops,
)
from rlreplay.app.writer.rollouts import apply_ack, apply_patch, apply_version
from rlreplay.app.writer.state import (
    EngineState,
    cache_charge,
    meta_bytes,
    table_record,
)
from rlreplay.app.writer.storage import RocksStorage
from rlreplay.wire.errors import TableExists, TableNotFound

log = logging.getLogger("rlreplay.app.writer.task_processor")

EVICT_LOW_WATERMARK = 0.9  # evict down to this fraction of the limit
EVICT_HARD_FACTOR = 1.1  # past this the writer evicts before anything else
#: Values an eviction writes a step at a time (a few ms of RocksDB, GIL held): smaller
#: steps raised the peak memory of 600 MB pushed through a 32 MB cache (test_memory.py).
EVICT_STEP_BYTES = 4 << 20
TRIM_EVERY_BYTES = 16 * 2**20  # evicted bytes between returns of free heap memory to the OS
_priority_of = operator.attrgetter("priority")


def each(effects: Iterator[Any]) -> None:
    """Run a ``map`` of calls for their effects, in C: no Python loop per item."""
    deque(effects, maxlen=0)


class SubmitOp(Protocol):
    """How the applier queues follow-up work (an eviction, a checkpoint) for the writer:
    the task processor's :meth:`~rlreplay.app.writer.task_processor.TaskProcessor.submit`."""

    def __call__(self, op: Op, *, housekeeping: bool = False) -> None: ...


class OpApplier:
    """The writer's work on tables and storage, which the task processor holds.

    Args:
        state: The engine's state (tables, storage, log).
        checkpointer: Runs the checkpoints and captures that :class:`CheckpointOp` and
            :class:`SnapshotOp` ask for.
        submit: Queues the evictions and checkpoints the applier finds due.
        seed: Seeds the removers' random choices.
    """

    def __init__(
        self,
        state: EngineState,
        *,
        checkpointer: Checkpointer,
        submit: SubmitOp,
        seed: int | None = None,
    ) -> None:
        self._state = state
        self._checkpointer = checkpointer
        self._submit = submit
        self._np_rng = np.random.default_rng(seed)
        self._evict_queued = False
        self._checkpoint_queued = False
        self._evicted_since_trim = 0
        self.checkpoint_retry = Backoff()
        self.evict_retry = Backoff()
        self.store_retry = Backoff(most_s=2.0)
        #: background failures by kind (checkpoint, evict, store), for /metrics
        self.background_failures: dict[str, int] = {"checkpoint": 0, "evict": 0, "store": 0}
        self.last_background_error: str | None = None

    # -- background work the writer queues --------------------------------------------------

    def queue_checkpoint_when_due(self) -> None:
        """Queue a checkpoint (the log has grown past its interval) unless one is queued or
        a failed one is waiting out its backoff."""
        if not self._checkpoint_queued and self.checkpoint_retry.due():
            self._checkpoint_queued = True
            self._submit(CheckpointOp(0, weight=0, due=True))

    def retry_in(self) -> float | None:
        """Seconds until a failed background write is due again (None: none failed)."""
        due = [r.next_try for r in (self.checkpoint_retry, self.evict_retry) if r.failing]
        if not due:
            return None
        return max(0.0, min(due) - time.monotonic())

    def queue_retries(self) -> None:
        """Queue the failed background writes that are due again."""
        if self.checkpoint_retry.failing and self.checkpoint_retry.due():
            if not self._checkpoint_queued and (self._state.wal is not None or self._state.store):
                self._checkpoint_queued = True
                self._submit(CheckpointOp(0, weight=0, due=True))
        if self.evict_retry.failing and self.evict_retry.due():
            if not self._evict_queued and self._state.ledger.over:
                self._evict_queued = True
                self._submit(EvictOp(0, weight=0), housekeeping=True)

    async def evict_if_far_over(self) -> None:
        """Evict now, before the next op, when the cache is far past its limit."""
        s = self._state
        if (
            s.ledger.over
            and s.storage.evicts
            and s.ledger.bytes > s.ledger.limit_bytes * EVICT_HARD_FACTOR
        ):
            await self._evict()

    def _background_failed(self, kind: str, exc: BaseException, retry: Backoff) -> None:
        """Background work failed: log, count, and wait before the next try."""
        retry.failed()
        self.background_failures[kind] = self.background_failures.get(kind, 0) + 1
        self.last_background_error = f"{kind}: {exc}"
        log.error(
            "%s failed (%s); trying again in %.1f s (failure %d in a row)",
            kind,
            exc,
            max(0.0, retry.next_try - time.monotonic()),
            retry.failures,
        )

    @property
    def _rocks(self) -> RocksStorage | None:
        """The storage when it is RocksDB-backed (hybrid, disk); None in memory mode."""
        storage = self._state.storage
        return storage if isinstance(storage, RocksStorage) else None

    @property
    def storage_failing(self) -> bool:
        """Whether background writes to storage are failing now."""
        return self.checkpoint_retry.failing or self.evict_retry.failing or self.store_retry.failing

    async def _write_through(self, t: Table, items: Any, slots: list[int]) -> bool:
        """Disk mode: write a push's values and metadata to RocksDB; False if it failed (the
        values then stay in the cache, dirty, until a checkpoint or eviction writes them: the
        op is in the log and must be applied all the same)."""
        rocks, io = self._rocks, self._state.io
        assert rocks is not None
        puts: list[tuple[bytes, bytes]] = []
        for it, slot in zip(items, slots, strict=True):
            puts.append((value_key(t.prefix, it.key), it.value))
            puts.append((meta_key(t.prefix, it.key), meta_bytes(t, slot)))
        deletes = rocks.take_deletes()
        try:
            if rocks.db.failure is not None:
                await io.run(rocks.db.recover)
            await rocks.write_in_steps(io, puts, deletes)
        except OSError as exc:
            rocks.give_back_deletes(deletes)
            self._background_failed("store", exc, self.store_retry)
            return False
        self.store_retry.succeeded()
        return True

    async def apply(self, op: Op, *, replay: bool = False) -> None:
        """Apply one op to the tables and storage (also used to replay the log)."""
        if type(op) is Op:
            return  # a marker (see stop)
        if isinstance(op, PutOp):
            await self._put(op, replay=replay)
        elif isinstance(op, DeleteOp):
            await self._delete(op.table, op.keys, op.seq)
            op.table.pending.applied(op.seq, op.weight)
        elif isinstance(op, PriorityOp):
            self._priorities(op)
        elif isinstance(op, PatchOp):
            apply_patch(self._state, op)
            await self._evict_if_over(replay)
        elif isinstance(op, AckOp):
            apply_ack(op)
        elif isinstance(op, VersionOp):
            apply_version(op)
        elif isinstance(op, EpisodeAppendOp):
            await apply_episode_append(op, self._state)
            await self._evict_if_over(replay)
        elif isinstance(op, EpisodeDeleteOp):
            apply_episode_delete(op, self._state)
        elif isinstance(op, EpisodePriorityOp):
            apply_episode_priorities(op)
        elif isinstance(op, PopulateOp):
            self._populate(op)
        elif isinstance(op, EvictOp):
            self._evict_queued = False
            await self._evict()
        elif isinstance(op, CheckpointOp):
            self._checkpoint_queued = False
            try:
                await self._checkpointer.checkpoint(full=op.full, spare_values=op.due)
            except OSError as exc:
                self._background_failed("checkpoint", exc, self.checkpoint_retry)
                raise_into(op, storage_error(exc, str(self._state.settings.data_dir)))
            else:
                self.checkpoint_retry.succeeded()
        elif isinstance(op, SnapshotOp):
            try:
                op.meta.update(await self._checkpointer.capture(op.dest))
            except OSError as exc:  # the caller's to report; the writer goes on
                raise_into(op, storage_error(exc, str(op.dest)))
        elif isinstance(op, CreateTableOp):
            await self._create(op)
        elif isinstance(op, DropTableOp):
            await self._drop(op.table)
        else:  # pragma: no cover - exhaustive
            raise TypeError(f"unknown op {op!r}")

    async def _put(self, op: PutOp, *, replay: bool) -> None:
        t, s = op.table, self._state
        if t.dropped:
            return
        items = op.items
        keys = [it.key for it in items]
        if len(set(keys)) != len(keys):  # the last of a repeated key wins, in its place:
            # pushed again, a key moves to the newest end of the order, as in two pushes
            last = {key: i for i, key in enumerate(keys)}
            items = [items[i] for i in sorted(last.values())]
            keys = [it.key for it in items]
        n = len(items)
        through = not s.storage.caches_pushes
        # each item's push: its sequence number and time (pushes joined into one op differ;
        # for a single push, seqs repeats its number for every item)
        ts: float | np.ndarray = op.inserted_at
        seq: int | np.ndarray = op.seq
        seqs: Any = itertools.repeat(op.seq)
        if op.parts:
            counts = [len(part.items) for part in op.parts]
            seq = np.repeat(np.array([part.seq for part in op.parts], np.int64), counts)
            ts = np.repeat(np.array([part.inserted_at for part in op.parts]), counts)
            seqs = seq.tolist()
        values, retired = t.values, t.retired
        found = list(map(t.index.get, keys))
        replaced: list[int] = []
        was_cached: list[int] = []
        if found.count(None) == n:  # all new keys (the common push): slots in one go
            slot_list = t.alloc_slots(keys)
        else:
            # what replaced items leave behind: slots still in selection, cached values
            old = [slot for slot in found if slot is not None]
            t.rollouts.forget(old)
            replaced = [slot for slot in old if not retired[slot]]
            was_cached = [slot for slot in old if values[slot] is not None]
            if was_cached and through:  # otherwise the ledger's add below replaces them
                s.ledger.discard_many(t, was_cached)
            if len(old) < n:  # new keys get slots, in one go
                new_at = [i for i, slot in enumerate(found) if slot is None]
                for i, slot in zip(new_at, t.alloc_slots([keys[i] for i in new_at]), strict=True):
                    found[i] = slot
            slot_list = cast(list[int], found)
        # the pending entries this op made go, unless a later op replaced them (written
        # through, they stay while RocksDB writes the values: readers find them meanwhile)
        if not through:
            t.pending.settle(keys, seqs)
        # new keys (the common push) skip the numpy work on replaced cached values
        cached_before = np.array(was_cached, dtype=np.int64) if was_cached else None
        if cached_before is not None:
            t.forget_cached(cached_before)
        slots = np.array(slot_list, dtype=np.int64)
        new_values = [it.value for it in items]
        sizes = np.fromiter(map(len, new_values), np.int64, n)
        sizes += np.fromiter(map(len, keys), np.int64, n)
        prios = np.fromiter(map(_priority_of, items), np.float64, n)
        fields: list[dict[str, Any]] | None = None
        if t.index_fields:
            fields = [index_fields_of(it.value, t.index_fields) for it in items]
        t.assign(slots, slot_list, prios, sizes, ts, seq, fields, replaced)
        t.rollouts.on_put(slot_list, items, new_values)  # before a write-through of its meta
        written = through and await self._write_through(t, items, slot_list)
        if written:
            t.mark_written(slots, slot_list, sizes.tolist())
        else:  # cached pushes, and written-through ones RocksDB refused: held here meanwhile
            t.hold_values(slots, slot_list, new_values, sizes, cached_before)
            s.ledger.add_many(t, slot_list, (sizes + ENTRY_OVERHEAD).tolist())
        t.select(slots, prios, ts, fields)
        if through:
            t.pending.settle(keys, seqs)
        t.rollouts.changed.notify()
        if not replay:
            await self._trim(t)
        for part in queued_ops(op):
            t.pending.applied(part.seq, part.weight)
        await self._evict_if_over(replay)

    async def _evict_if_over(self, replay: bool) -> None:
        """Evict now (replaying) or queue an eviction when the cache is past its limit."""
        s = self._state
        if s.ledger.over and s.storage.evicts:
            if replay:
                await self._evict()
            elif not self._evict_queued:
                self._evict_queued = True
                self._submit(EvictOp(0, weight=0), housekeeping=True)

    async def _trim(self, t: Table) -> None:
        """Delete items chosen by the remover until the table fits ``max_size``."""
        slots, slot_list, keys = t.take_excess(self._np_rng)
        if slot_list:
            await self._free(t, slots, slot_list, keys)

    async def trim_all(self) -> None:
        """Bring every table within its ``max_size`` (after replaying the log)."""
        for t in list(self._state.tables.values()):
            await self._trim(t)

    async def _delete(self, t: Table, keys: Any, seq: int) -> None:
        if t.dropped:
            return
        if seq:
            t.pending.settle(keys, itertools.repeat(seq))
        index_get = t.index.get
        found = {key: slot for key in keys if (slot := index_get(key)) is not None}
        if not found:
            return
        slot_list = list(found.values())
        slots = np.array(slot_list, dtype=np.int64)
        t.unselect(slots, remover=True)
        await self._free(t, slots, slot_list, list(found))

    async def _free(
        self, t: Table, slots: np.ndarray, slot_list: list[int], keys: list[str]
    ) -> None:
        """Forget the distinct, unselected ``slots`` holding ``keys``: their cached values,
        their RocksDB records (queued deletes) and the slots themselves."""
        s = self._state
        values = t.values
        cached = [slot for slot in slot_list if values[slot] is not None]
        if cached:
            s.ledger.discard_many(t, cached)
        on_disk = t.free_slots(slots, slot_list, keys)
        rocks = self._rocks
        if len(on_disk) and rocks is not None:
            deletes = rocks.deletes
            for i in on_disk.tolist():
                deletes.append(value_key(t.prefix, keys[i]))
                deletes.append(meta_key(t.prefix, keys[i]))
        if rocks is not None and len(rocks.deletes) > 20_000 and not rocks.db.failure:
            deletes = rocks.take_deletes()
            try:
                await rocks.write_in_steps(s.io, (), deletes)
            except OSError as exc:  # they go with the next write that works
                rocks.give_back_deletes(deletes)
                self._background_failed("store", exc, self.store_retry)

    def _priorities(self, op: PriorityOp) -> None:
        if not op.table.dropped:
            op.table.set_priorities(op.keys, op.priorities)
        op.table.pending.applied(op.seq, op.weight)

    def _populate(self, op: PopulateOp) -> None:
        t, slot = op.table, op.slot
        size = t.populate(slot, op.value, op.version)
        if size is None:
            return
        self._state.ledger.add(t, slot, cache_charge(size))
        if self._state.ledger.over and not self._evict_queued:
            self._evict_queued = True
            self._submit(EvictOp(0, weight=0), housekeeping=True)

    async def _evict(self) -> None:
        """Move cold values to RocksDB until the cache is under its low watermark."""
        s, rocks = self._state, self._rocks
        if rocks is None or not s.ledger.over:
            return
        if not self.evict_retry.due():
            return  # failing: the retry is queued when due
        picked = s.ledger.victims(int(s.ledger.limit_bytes * EVICT_LOW_WATERMARK))
        victims: list[tuple[Table, int]] = []
        chunks: list[tuple[ChunkResidency, int]] = []  # episode tables' sealed chunks
        for owner, slot in picked:
            if isinstance(owner, ChunkResidency):
                chunks.append((owner, slot))
            else:
                victims.append((owner, slot))
        deletes = rocks.take_deletes()
        evicted = at = 0
        try:
            if rocks.db.failure is not None:
                await s.io.run(rocks.db.recover)
            await rocks.write_in_steps(s.io, chunk_puts(chunks), deletes)
            deletes = []
            evicted += chunks_evicted(s, chunks)  # written: they leave memory
            chunks = []
            # a step at a time (try_write: no wait for a flush with the GIL held), each
            # step's victims leaving the cache once written, so a failure keeps those
            while at < len(victims):
                step = at
                at, puts = self._evict_step(victims, step)
                await rocks.write_in_steps(s.io, puts, step_bytes=EVICT_STEP_BYTES)
                for t, slot in victims[step:at]:  # only now: readers find it in RocksDB
                    if not (t.dropped or t.keys[slot] is None or t.values[slot] is None):
                        evicted += t.evict(slot)
        except OSError as exc:  # the values stay in the cache, over its limit, until a retry
            rocks.give_back_deletes(deletes)
            self._requeue(victims)  # those not evicted yet (evicted ones hold no value)
            chunks_kept(s, chunks)
            self._background_failed("evict", exc, self.evict_retry)
            return
        finally:
            self._evicted_since_trim += evicted
        self.evict_retry.succeeded()
        if self._evicted_since_trim >= max(TRIM_EVERY_BYTES, s.ledger.limit_bytes // 2):
            self._evicted_since_trim = 0
            await s.io.run(release_free_memory)

    @staticmethod
    def _evict_step(
        victims: list[tuple[Table, int]], at: int
    ) -> tuple[int, list[tuple[bytes, bytes]]]:
        """The writes of ``victims[at:]`` up to a checkpoint step's bytes: where the next
        step starts, and the puts (values not yet in RocksDB, changed metadata)."""
        puts: list[tuple[bytes, bytes]] = []
        size = 0
        end = min(len(victims), at + STEP_SLOTS)
        while at < end and size < EVICT_STEP_BYTES:
            t, slot = victims[at]
            at += 1
            key, value = t.keys[slot], t.values[slot]
            if t.dropped or key is None or value is None:
                continue
            if t.dirty[slot]:
                puts.append((value_key(t.prefix, key), value))
                size += len(value)
            if t.meta_dirty[slot] or t.dirty[slot]:
                puts.append((meta_key(t.prefix, key), meta_bytes(t, slot)))
        return at, puts

    def _requeue(self, victims: list[tuple[Table, int]]) -> None:
        """Give back to the ledger the victims an eviction that failed had taken."""
        by_table: dict[Table, list[int]] = {}
        for t, slot in victims:
            if not t.dropped and t.keys[slot] is not None and t.values[slot] is not None:
                by_table.setdefault(t, []).append(slot)
        for t, slots in by_table.items():
            charges = [cache_charge(int(t.size[slot])) for slot in slots]
            self._state.ledger.add_many(t, slots, charges)

    async def _create(self, op: CreateTableOp) -> None:
        s = self._state
        existing = s.tables.get(op.name)
        if existing is not None:
            if existing.config != op.config:
                raise_into(op, TableExists(f"table {op.name!r} exists with another config"))
            return
        table = Table(op.name, s.next_tid, op.config)
        s.next_tid += 1
        if table.episodes is not None and self._rocks is not None:  # where its chunks go
            table.episodes.residency.store = self._rocks.db
            table.episodes.residency.prefix = table.prefix
        if self._rocks is not None:
            await self._store_write_or_defer(
                [
                    (table_key(op.name), table_record(table)),
                    (NEXT_TID_KEY, pack_count(s.next_tid)),
                ],
                [],
            )
        s.tables[op.name] = table

    async def _drop(self, table: Table) -> None:
        s = self._state
        if not table.mark_dropped():
            return
        s.tables.pop(table.name, None)
        s.dropped_counters.add(table.counters)
        s.ledger.drop_table(table)
        if table.episodes is not None:
            s.ledger.drop_table(table.episodes.residency)
        table.fail_waiters(TableNotFound(f"table {table.name!r} was deleted"))
        table.rollouts.changed.notify()  # waiting claims look again, and find no table
        table.gate.close(TableNotFound(f"table {table.name!r} was deleted"))
        rocks = self._rocks
        if rocks is not None:
            ranges = table_ranges(table.tid)
            record = table_key(table.name)
            # a table record put off by a failed write must not outlive the table: the
            # checkpoint's batch applies its deletes before its puts
            rocks.deferred_puts = [(k, v) for k, v in rocks.deferred_puts if k != record]
            rocks.deletes.append(record)
            await self._store_write_or_defer([], ranges)

    async def _store_write_or_defer(
        self, puts: list[tuple[bytes, bytes]], ranges: list[tuple[bytes, bytes]]
    ) -> None:
        """Write table records and range deletes now, with the deletes queued so far; if
        RocksDB fails, the next checkpoint's batch writes them (before the log that holds
        their op is cut), so the op is applied all the same."""
        rocks = self._rocks
        assert rocks is not None
        deletes = rocks.take_deletes()
        if rocks.db.failure is None and not rocks.deferred_puts and not rocks.deferred_ranges:
            try:
                await rocks.write_in_steps(self._state.io, puts, deletes, ranges)
                return
            except OSError as exc:
                self._background_failed("store", exc, self.store_retry)
        rocks.give_back_deletes(deletes)
        rocks.deferred_puts.extend(puts)
        rocks.deferred_ranges.extend(ranges)


def raise_into(op: Op, exc: BaseException) -> None:
    """Fail ``op``'s waiter with ``exc`` (the writer itself goes on)."""
    if op.future is not None and not op.future.done():
        op.future.set_exception(exc)
