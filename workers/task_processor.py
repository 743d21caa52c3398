"""The single writer: the only code that changes tables and storage.

Callers enqueue ops (see :mod:`app.engine.ops`) on the p0 queue (push, delete,
priorities, tables, checkpoint) or the p1 queue (evict, populate) and, if they want,
await the op's future. One owned task drains both: when both have work it takes p0 with
probability ``p0_probability`` (0.8 by default) and p1 otherwise, so housekeeping is
never starved. If the task dies, every queued op's future and every reader waiting on a
table fail with :class:`~clients.errors.Unavailable` instead of hanging.

With the write-ahead log on, the writer applies an op only once its record is durable: an
op whose log flush failed is refused (its caller answered an error) and is taken out of the
queue and of the pending index, so nothing refused is ever applied. Storage errors in
background work (checkpoints, evictions) are logged, counted and retried with backoff; they
never stop the writer.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import os
import random
import time
from collections import deque
from pathlib import Path
from typing import Any, cast

import msgpack
import numpy as np

from app.engine.ops import (
    CheckpointOp,
    CreateTableOp,
    DeleteOp,
    DropTableOp,
    EvictOp,
    Op,
    PopulateOp,
    PriorityOp,
    PutOp,
)
from app.engine.state import (
    EngineState,
    cache_charge,
    meta_bytes,
    meta_key,
    table_record,
    value_key,
)
from app.engine.table import Table
from app.storage.allocator import release_free_memory
from app.storage.cache import ENTRY_OVERHEAD
from app.storage.faults import Backoff, storage_error
from app.storage.rocks import LSN_KEY, NEXT_TID_KEY, table_prefix
from clients.errors import TableExists, TableNotFound, Unavailable

log = logging.getLogger(__name__)
_SNAPSHOT_BUFFER = 16 << 20  # the memory checkpoint's file buffer
_FLUSH_YIELD_EVERY = 4096  # slots a checkpoint visits between turns given to the event loop
_priority_of = operator.attrgetter("priority")

EVICT_LOW_WATERMARK = 0.9  # evict down to this fraction of the limit
EVICT_HARD_FACTOR = 1.1  # past this the writer evicts before anything else
YIELD_EVERY = 64  # ops applied between yields to the event loop
MEMORY_CHECKPOINT = "memory.ckpt"
TRIM_EVERY_BYTES = 16 * 2**20  # evicted bytes between returns of free heap memory to the OS


class TaskProcessor:
    """Owns the writer task and applies ops in order."""

    def __init__(
        self, state: EngineState, *, p0_probability: float, seed: int | None = None
    ) -> None:
        self._s = state
        self._p0_probability = p0_probability
        self._rng = random.Random(seed)
        self._np_rng = np.random.default_rng(seed)
        self.p0: deque[Op] = deque()
        self.p1: deque[Op] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._evict_queued = False
        self._disk_deletes: list[bytes] = []
        self._evicted_since_trim = 0
        self._checkpoint_queued = False
        self._idle = False
        self._checkpoint_bytes = int(state.settings.wal_checkpoint_mb * 2**20)
        #: The log position the last checkpoint covered (set by the engine on recovery).
        self.horizon = 0
        self.failure: BaseException | None = None
        self.applied_ops = 0
        self.last_apply_lag_s = 0.0
        self._current: Op | None = None  # the op taken from the queue and not finished
        self._applying = False  # ... and past its log wait: its pending entries are taken
        self.checkpoint_retry = Backoff()
        self.evict_retry = Backoff()
        self.store_retry = Backoff(most_s=2.0)
        #: background failures by kind (checkpoint, evict, store), for /metrics
        self.background_failures: dict[str, int] = {"checkpoint": 0, "evict": 0, "store": 0}
        self.last_background_error: str | None = None
        # RocksDB work put off by a failed write, done by the next checkpoint's batch
        self._deferred_puts: list[tuple[bytes, bytes]] = []
        self._deferred_ranges: list[tuple[bytes, bytes]] = []

    # -- lifetime -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer task."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="rlreplay-writer")
            self._task.add_done_callback(self._on_done)

    @property
    def running(self) -> bool:
        """True while the writer task runs."""
        return self._task is not None and not self._task.done()

    async def stop(self, timeout_s: float | None = 10.0) -> None:
        """Apply every queued p0 op, then stop the task; idempotent. Past ``timeout_s`` (a
        writer stuck on a failing disk) it stops anyway: what is left is in the log."""
        if self._task is None:
            return
        if self.running:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.submit(Op(0, future=fut, weight=0))  # a marker: the ops before it are applied
            try:
                await asyncio.wait_for(fut, timeout_s)
            except Unavailable:
                pass
            except TimeoutError:
                log.error("the writer did not finish its queue in %s s: stopping it", timeout_s)
        task, self._task = self._task, None
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception:  # it died earlier: logged and reported then (see _on_done)
            pass

    def _on_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            exc: BaseException = Unavailable("the writer stopped")
        else:
            err = task.exception()
            if err is None:
                return
            log.error("writer failed", exc_info=err)
            self.failure = err
            exc = Unavailable(f"the writer failed: {err!r}")
        self._fail_all(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for queue in (self.p0, self.p1):
            while queue:
                op = queue.popleft()
                if op.future is not None and not op.future.done():
                    op.future.set_exception(exc)
        for table in self._s.tables.values():
            table.fail_waiters(exc)

    # -- queueing -------------------------------------------------------------------------

    def submit(self, op: Op, *, p1: bool = False) -> None:
        """Enqueue an op (never blocks; the caller has checked the queue bound)."""
        if self._task is None or self._task.done():
            raise Unavailable("the writer is not running")
        op.queued_at = time.monotonic()
        (self.p1 if p1 else self.p0).append(op)
        self._s.queued_items += op.weight
        self._s.queued_bytes += op.nbytes
        self._wake.set()

    @property
    def lag_s(self) -> float:
        """Seconds the oldest queued op has waited (0 when both queues are empty)."""
        waiting = [q[0].queued_at for q in (self.p0, self.p1) if q]
        return time.monotonic() - min(waiting) if waiting else 0.0

    def oldest_queued_seq(self) -> int | None:
        """Sequence number of the oldest logged op still waiting in p0."""
        for op in self.p0:
            if op.seq:
                return op.seq
        return None

    @property
    def idle(self) -> bool:
        """True while the writer waits for work (no op half-applied)."""
        return self._idle

    async def _run(self) -> None:
        since_yield = 0
        while True:
            if not self.p0 and not self.p1:
                self._wake.clear()
                self._idle = True
                retry_in = self._retry_in()
                if retry_in is None:
                    await self._wake.wait()
                else:
                    try:
                        await asyncio.wait_for(self._wake.wait(), retry_in)
                    except TimeoutError:
                        pass
                self._idle = False
                since_yield = 0
                self._queue_retries()
                if not self.p0 and not self.p1:
                    continue
            s = self._s
            if (
                s.ledger.over
                and s.mode != "memory"
                and s.ledger.bytes > s.ledger.limit_bytes * EVICT_HARD_FACTOR
            ):
                await self._evict()
            if self.p0 and (not self.p1 or self._rng.random() < self._p0_probability):
                op = self.p0.popleft()
            else:
                op = self.p1.popleft()
            s.queued_items -= op.weight
            s.queued_bytes -= op.nbytes
            wal = s.wal
            self._current = op
            try:
                if op.seq and wal is not None and op.seq > wal.durable_lsn:
                    try:  # applied only once durable: a record the log lost is refused
                        await wal.commit(op.seq)
                    except OSError as exc:
                        wal.refuse(op.seq, op.seq, exc)  # (a no-op: commit raised for that)
                        self.drop_refused()
                        continue
                self._applying = True
                await self.apply(op)
            except Exception as exc:
                if op.future is not None and not op.future.done():
                    op.future.set_exception(exc)
                raise
            finally:
                self._current = None
                self._applying = False
            if op.future is not None and not op.future.done():
                op.future.set_result(None)
            self.applied_ops += 1
            if (
                wal is not None
                and not self._checkpoint_queued
                and wal.bytes_since_checkpoint > self._checkpoint_bytes
                and self.checkpoint_retry.due()
            ):
                self._checkpoint_queued = True
                self.submit(CheckpointOp(0, weight=0))
            self._queue_retries()
            since_yield += 1
            if since_yield >= YIELD_EVERY:
                since_yield = 0
                await asyncio.sleep(0)

    # -- failures -------------------------------------------------------------------------

    def drop_refused(self) -> None:
        """Take the ops whose log record a failed flush lost out of the queue, fail their
        callers, and recompute the pending index of their tables without them; idempotent
        (the caller that saw the failure and the writer both call it)."""
        s = self._s
        wal = s.wal
        if wal is None:
            return
        refused: list[Op] = []
        kept: deque[Op] = deque()
        for op in self.p0:
            if op.seq and (op.refused or wal.refusal(op.seq) is not None):
                refused.append(op)
                s.queued_items -= op.weight
                s.queued_bytes -= op.nbytes
            else:
                kept.append(op)
        current = self._current
        if current is not None and not self._applying and current.seq:
            if current.refused or wal.refusal(current.seq) is not None:
                refused.append(current)
        if not refused:
            return
        self.p0.clear()
        self.p0.extend(kept)
        tables: list[Table] = []
        for op in refused:
            error = wal.refusal(op.seq)
            if not op.refused:
                op.refused = True
                if error is not None:
                    raise_into(op, storage_error(error.error, str(wal.folder)))
                if op.future is not None and op.future.done():
                    op.future.exception()  # the caller may have answered already
            if isinstance(op, DropTableOp):
                op.table.dropping = False
            table: Table | None = getattr(op, "table", None)
            if table is not None and table not in tables:
                tables.append(table)
        for t in tables:
            waiting = [op for op in kept if _item_op_of(op, t)]
            if current is not None and not current.refused and _item_op_of(current, t):
                if self._applying:
                    t.rebuild_pending(waiting, applying=current)
                else:
                    t.rebuild_pending([current, *waiting])
            else:
                t.rebuild_pending(waiting)

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

    def _retry_in(self) -> float | None:
        """Seconds until a failed background write is due again (None: none failed)."""
        due = [r.next_try for r in (self.checkpoint_retry, self.evict_retry) if r.failing]
        if not due:
            return None
        return max(0.0, min(due) - time.monotonic())

    def _queue_retries(self) -> None:
        """Queue the failed background writes that are due again."""
        if self.checkpoint_retry.failing and self.checkpoint_retry.due():
            if not self._checkpoint_queued and (self._s.wal is not None or self._s.store):
                self._checkpoint_queued = True
                self.submit(CheckpointOp(0, weight=0))
        if self.evict_retry.failing and self.evict_retry.due():
            if not self._evict_queued and self._s.ledger.over:
                self._evict_queued = True
                self.submit(EvictOp(0, weight=0), p1=True)

    @property
    def storage_failing(self) -> bool:
        """Whether background writes to storage are failing now."""
        return self.checkpoint_retry.failing or self.evict_retry.failing or self.store_retry.failing

    async def _write_through(self, t: Table, items: Any, slots: list[int]) -> bool:
        """Disk mode: write a push's values and metadata to RocksDB; False if it failed (the
        values then stay in the cache, dirty, until a checkpoint or eviction writes them: the
        op is in the log and must be applied all the same)."""
        s = self._s
        assert s.store is not None
        puts: list[tuple[bytes, bytes]] = []
        for it, slot in zip(items, slots, strict=True):
            puts.append((value_key(t, it.key), it.value))
            puts.append((meta_key(t, it.key), meta_bytes(t, slot)))
        deletes = self._take_disk_deletes()
        try:
            if s.store.failure is not None:
                await s.io.run(s.store.recover)
            await s.io.run(s.store.write, puts, deletes)
        except OSError as exc:
            self._disk_deletes[:0] = deletes
            self._background_failed("store", exc, self.store_retry)
            return False
        self.store_retry.succeeded()
        return True

    # -- applying -------------------------------------------------------------------------

    async def apply(self, op: Op, *, replay: bool = False) -> None:
        """Apply one op to the tables and storage (also used to replay the log)."""
        if type(op) is Op:
            return  # a marker (see stop)
        if isinstance(op, PutOp):
            await self._put(op, replay=replay)
        elif isinstance(op, DeleteOp):
            await self._delete(op.table, op.keys, op.seq)
            op.table.applied(op.seq, op.weight)
        elif isinstance(op, PriorityOp):
            self._priorities(op)
        elif isinstance(op, PopulateOp):
            self._populate(op)
        elif isinstance(op, EvictOp):
            self._evict_queued = False
            await self._evict()
        elif isinstance(op, CheckpointOp):
            self._checkpoint_queued = False
            try:
                await self.checkpoint(full=op.full)
            except OSError as exc:
                self._background_failed("checkpoint", exc, self.checkpoint_retry)
                raise_into(op, storage_error(exc, str(self._s.settings.data_dir)))
            else:
                self.checkpoint_retry.succeeded()
        elif isinstance(op, CreateTableOp):
            await self._create(op)
        elif isinstance(op, DropTableOp):
            await self._drop(op.table)
        else:  # pragma: no cover - exhaustive
            raise TypeError(f"unknown op {op!r}")

    async def _put(self, op: PutOp, *, replay: bool) -> None:
        t, s = op.table, self._s
        if t.dropped:
            return
        items = op.items
        keys = [it.key for it in items]
        if len(set(keys)) != len(keys):  # the last of a repeated key wins
            items = list({it.key: it for it in items}.values())
            keys = [it.key for it in items]
        n = len(items)
        mode, ts, seq = s.mode, op.inserted_at, op.seq
        index, values, retired, pending = t.index, t.values, t.retired, t.pending
        index_get, pending_get = index.get, pending.get
        found = list(map(index_get, keys))
        # what replaced items leave behind: slots still in selection, values in the cache
        old = [slot for slot in found if slot is not None]
        replaced = [slot for slot in old if not retired[slot]]
        was_cached = [slot for slot in old if values[slot] is not None]
        if was_cached and mode == "disk":  # otherwise the ledger's add below replaces them
            s.ledger.discard_many(t, was_cached)
        if len(old) < len(found):  # new keys get slots, in one go
            new_at = [i for i, slot in enumerate(found) if slot is None]
            for i, slot in zip(new_at, t.alloc_slots([keys[i] for i in new_at]), strict=True):
                found[i] = slot
        slot_list = cast(list[int], found)
        # the pending entries this op made, unless a later op replaced them (in disk mode
        # they stay while RocksDB writes the values: readers find them there meanwhile)
        mine = [
            key
            for key, e in zip(keys, map(pending_get, keys), strict=True)
            if e is not None and e[0] == seq
        ]
        if mode != "disk":
            deque(map(pending.__delitem__, mine), maxlen=0)
        # new keys (the common push) skip the numpy work on replaced cached values
        cached_before = np.array(was_cached, dtype=np.int64) if was_cached else None
        if cached_before is not None:
            t.bytes_in_cache -= int(t.size[cached_before].sum())
        slots = np.array(slot_list, dtype=np.int64)
        if replaced:
            gone = np.array(replaced, dtype=np.int64)
            t.sampler.remove(gone)
            if t.remover is not None:
                t.remover.remove(gone)
        new_values = [it.value for it in items]
        sizes = np.fromiter(map(len, new_values), np.int64, n)
        sizes += np.fromiter(map(len, keys), np.int64, n)
        prios = np.fromiter(map(_priority_of, items), np.float64, n)
        t.priority[slots] = prios
        t.inserted_at[slots] = ts
        t.times_sampled[slots] = 0
        t.size[slots] = sizes
        t.version[slots] += 1
        t.referenced[slots] = 0
        t.order[slots] = np.arange(t.next_order, t.next_order + len(slots))
        t.put_seq[slots] = seq
        t.next_order += len(slots)
        fields: list[dict[str, Any]] | None = None
        if t.index_fields:
            fields = [index_fields_of(it.value, t.index_fields) for it in items]
            t.fields.update(zip(slot_list, fields, strict=True))
        written = mode == "disk" and await self._write_through(t, items, slot_list)
        if written:
            t.meta_dirty[slots] = 0
            for slot, size in zip(slot_list, sizes.tolist(), strict=True):
                retired[slot] = 0
                values[slot] = None
                t.on_disk[slot] = 1
                t.dirty[slot] = 0
                t.bytes_on_disk += size - int(t.disk_size[slot])
                t.disk_size[slot] = size
        else:  # hybrid and memory; disk mode when RocksDB failed: the cache holds it meanwhile
            t.meta_dirty[slots] = 1
            for slot, value in zip(slot_list, new_values, strict=True):
                values[slot] = value
            # short-lived views of the flag bytearrays (a live view would block their growth)
            np.frombuffer(retired, np.uint8)[slots] = 0
            np.frombuffer(t.dirty, np.uint8)[slots] = 1
            if cached_before is not None:  # replaced while cached: like a hit (CLOCK)
                t.referenced[cached_before] = 1
            s.ledger.add_many(t, slot_list, (sizes + ENTRY_OVERHEAD).tolist())
            t.bytes_in_cache += int(sizes.sum())
        times = np.full(len(slots), ts)
        t.sampler.insert(slots, prios, times, fields)
        if t.remover is not None:
            t.remover.insert(slots, prios, times, fields)
        if mode == "disk":
            for key in mine:
                entry = t.pending.get(key)
                if entry is not None and entry[0] == seq:
                    del t.pending[key]
        t.counters.inserts += len(items)
        if not replay:
            await self._trim(t)
        t.applied(op.seq, op.weight)
        if s.ledger.over and mode != "memory":
            if replay:
                await self._evict()
            elif not self._evict_queued:
                self._evict_queued = True
                self.submit(EvictOp(0, weight=0), p1=True)

    async def _trim(self, t: Table) -> None:
        """Delete items chosen by the remover until the table fits ``max_size``."""
        max_size = t.config.max_size
        if max_size is None or t.remover is None or len(t.index) <= max_size:
            return
        excess = min(len(t.index) - max_size, len(t.remover))
        slots = t.remover.evict(excess, self._np_rng)
        if not len(slots):
            return
        # the remover dropped them; the sampler drops the ones it still holds
        self._unselect_many(t, slots, remover=False)
        slot_list = slots.tolist()
        keys = [t.keys[slot] for slot in slot_list]
        # a pending op decides what readers see of a key
        t.visible -= len(keys) - sum(map(t.pending.__contains__, keys))
        await self._free(t, slots, slot_list, keys)

    async def trim_all(self) -> None:
        """Bring every table within its ``max_size`` (after replaying the log)."""
        for t in list(self._s.tables.values()):
            await self._trim(t)

    async def _delete(self, t: Table, keys: Any, seq: int) -> None:
        if t.dropped:
            return
        pending, index_get = t.pending, t.index.get
        if seq:
            pending_get = pending.get
            for key in keys:
                entry = pending_get(key)
                if entry is not None and entry[0] == seq:
                    del pending[key]
        found = {key: slot for key in keys if (slot := index_get(key)) is not None}
        if not found:
            return
        slot_list = list(found.values())
        slots = np.array(slot_list, dtype=np.int64)
        self._unselect_many(t, slots, remover=True)
        await self._free(t, slots, slot_list, list(found))

    def _unselect_many(self, t: Table, slots: np.ndarray, *, remover: bool) -> None:
        """Take ``slots`` out of selection (the sampler, and the remover if ``remover``),
        those not out already, and mark them all retired."""
        with memoryview(t.retired) as flags:  # released at once: the bytearray must grow
            retired = np.frombuffer(flags, np.uint8)
            live = slots[retired[slots] == 0]
            retired[slots] = 1
            del retired
        if len(live):
            t.sampler.remove(live)
            if remover and t.remover is not None:
                t.remover.remove(live)

    async def _free(
        self, t: Table, slots: np.ndarray, slot_list: list[int], keys: list[str]
    ) -> None:
        """Forget the distinct, unselected ``slots`` holding ``keys``: their cached values,
        their RocksDB records (queued deletes) and the slots themselves."""
        s = self._s
        values = t.values
        cached = [slot for slot in slot_list if values[slot] is not None]
        if cached:
            s.ledger.discard_many(t, cached)
            t.bytes_in_cache -= int(t.size[cached].sum())
        with memoryview(t.on_disk) as flags:
            on_disk = np.flatnonzero(np.frombuffer(flags, np.uint8)[slots])
        if len(on_disk):
            deletes = self._disk_deletes
            for i in on_disk.tolist():
                deletes.append(value_key(t, keys[i]))
                deletes.append(meta_key(t, keys[i]))
            t.bytes_on_disk -= int(t.disk_size[slots[on_disk]].sum())
        t.free_slots(slots, slot_list, keys)
        t.counters.deletes += len(slot_list)
        if len(self._disk_deletes) > 20_000 and s.store is not None and not s.store.failure:
            deletes = self._take_disk_deletes()
            try:
                await s.io.run(s.store.write, (), deletes)
            except OSError as exc:  # they go with the next write that works
                self._disk_deletes[:0] = deletes
                self._background_failed("store", exc, self.store_retry)

    def _take_disk_deletes(self) -> list[bytes]:
        out, self._disk_deletes = self._disk_deletes, []
        return out

    def _priorities(self, op: PriorityOp) -> None:
        t = op.table
        if t.dropped:
            return
        slots, prios = [], []
        for key, prio in zip(op.keys, op.priorities, strict=True):
            slot = t.index.get(key)
            if slot is None:
                continue
            t.priority[slot] = prio
            t.meta_dirty[slot] = 1
            if not t.retired[slot]:
                slots.append(slot)
                prios.append(prio)
        if slots:
            sa, pa = np.asarray(slots, dtype=np.int64), np.asarray(prios, dtype=np.float64)
            t.sampler.update(sa, pa)
            if t.remover is not None:
                t.remover.update(sa, pa)
        t.applied(op.seq, op.weight)

    def _populate(self, op: PopulateOp) -> None:
        t, slot = op.table, op.slot
        if t.dropped or slot >= len(t.keys) or t.keys[slot] is None:
            return
        if int(t.version[slot]) != op.version or t.values[slot] is not None:
            return
        t.values[slot] = op.value
        t.dirty[slot] = 0
        size = int(t.size[slot])
        self._s.ledger.add(t, slot, cache_charge(size))
        t.bytes_in_cache += size
        t.counters.populates += 1
        if self._s.ledger.over and not self._evict_queued:
            self._evict_queued = True
            self.submit(EvictOp(0, weight=0), p1=True)

    async def _evict(self) -> None:
        """Move cold values to RocksDB until the cache is under its low watermark."""
        s = self._s
        if s.store is None or not s.ledger.over:
            return
        if not self.evict_retry.due():
            return  # failing: the retry is queued when due
        victims = s.ledger.victims(int(s.ledger.limit_bytes * EVICT_LOW_WATERMARK))
        puts: list[tuple[bytes, bytes]] = []
        for t, slot in victims:
            key, value = t.keys[slot], t.values[slot]
            if t.dropped or key is None or value is None:
                continue
            if t.dirty[slot]:
                puts.append((value_key(t, key), value))
            if t.meta_dirty[slot] or t.dirty[slot]:
                puts.append((meta_key(t, key), meta_bytes(t, slot)))
        deletes = self._take_disk_deletes()
        try:
            if s.store.failure is not None:
                await s.io.run(s.store.recover)
            await s.io.run(s.store.write, puts, deletes)
        except OSError as exc:  # the values stay in the cache, over its limit, until a retry
            self._disk_deletes[:0] = deletes
            self._requeue(victims)
            self._background_failed("evict", exc, self.evict_retry)
            return
        self.evict_retry.succeeded()
        evicted = 0
        for t, slot in victims:  # only now: readers find the value in RocksDB from here on
            if t.dropped or t.keys[slot] is None or t.values[slot] is None:
                continue
            size = int(t.size[slot])
            evicted += size
            if t.dirty[slot] or not t.on_disk[slot]:
                t.bytes_on_disk += size - int(t.disk_size[slot])
                t.disk_size[slot] = size
            t.on_disk[slot] = 1
            t.values[slot] = None
            t.dirty[slot] = t.meta_dirty[slot] = 0
            t.bytes_in_cache -= size
            t.counters.evictions_to_disk += 1
        self._evicted_since_trim += evicted
        if self._evicted_since_trim >= max(TRIM_EVERY_BYTES, s.ledger.limit_bytes // 2):
            self._evicted_since_trim = 0
            await s.io.run(release_free_memory)

    def _requeue(self, victims: list[tuple[Table, int]]) -> None:
        """Give back to the ledger the victims an eviction that failed had taken."""
        by_table: dict[Table, list[int]] = {}
        for t, slot in victims:
            if not t.dropped and t.keys[slot] is not None and t.values[slot] is not None:
                by_table.setdefault(t, []).append(slot)
        for t, slots in by_table.items():
            charges = [cache_charge(int(t.size[slot])) for slot in slots]
            self._s.ledger.add_many(t, slots, charges)

    async def _create(self, op: CreateTableOp) -> None:
        s = self._s
        existing = s.tables.get(op.name)
        if existing is not None:
            if existing.config != op.config:
                raise_into(op, TableExists(f"table {op.name!r} exists with another config"))
            return
        table = Table(op.name, s.next_tid, op.config)
        s.next_tid += 1
        if s.store is not None:
            await self._store_write_or_defer(
                [
                    (b"t" + op.name.encode(), table_record(table)),
                    (NEXT_TID_KEY, s.next_tid.to_bytes(8, "big")),
                ],
                [],
            )
        s.tables[op.name] = table

    async def _drop(self, table: Table) -> None:
        s = self._s
        if table.dropped:
            return
        table.dropped = True
        s.tables.pop(table.name, None)
        s.dropped_counters.add(table.counters)
        s.ledger.drop_table(table)
        table.fail_waiters(TableNotFound(f"table {table.name!r} was deleted"))
        table.gate.close(TableNotFound(f"table {table.name!r} was deleted"))
        if s.store is not None:
            ranges = [
                (table_prefix(tag, table.tid), table_prefix(tag, table.tid + 1))
                for tag in (b"v", b"m")
            ]
            record = b"t" + table.name.encode()
            # a table record put off by a failed write must not outlive the table: the
            # checkpoint's batch applies its deletes before its puts
            self._deferred_puts = [(k, v) for k, v in self._deferred_puts if k != record]
            self._disk_deletes.append(record)
            await self._store_write_or_defer([], ranges)

    async def _store_write_or_defer(
        self, puts: list[tuple[bytes, bytes]], ranges: list[tuple[bytes, bytes]]
    ) -> None:
        """Write table records and range deletes now, with the deletes queued so far; if
        RocksDB fails, the next checkpoint's batch writes them (before the log that holds
        their op is cut), so the op is applied all the same."""
        s = self._s
        assert s.store is not None
        deletes = self._take_disk_deletes()
        if s.store.failure is None and not self._deferred_puts and not self._deferred_ranges:
            try:
                await s.io.run(s.store.write, puts, deletes, ranges)
                return
            except OSError as exc:
                self._background_failed("store", exc, self.store_retry)
        self._disk_deletes[:0] = deletes
        self._deferred_puts.extend(puts)
        self._deferred_ranges.extend(ranges)

    # -- checkpoints ----------------------------------------------------------------------

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
        s = self._s
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
        s = self._s
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
                    puts.append((value_key(t, key), value))
                    size = int(t.size[slot])
                    t.bytes_on_disk += size - int(t.disk_size[slot])
                    t.disk_size[slot] = size
                    t.on_disk[slot] = 1
                    t.dirty[slot] = 0
                puts.append((meta_key(t, key), meta_bytes(t, slot)))
                t.meta_dirty[slot] = 0
        puts.append((LSN_KEY, covered.to_bytes(8, "big")))
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
        s = self._s
        header = {
            "lsn": covered,
            "next_tid": s.next_tid,
            "tables": [
                {"name": t.name, "id": t.tid, "config": t.config.to_wire()}
                for t in s.tables.values()
            ],
        }
        await s.io.run(
            _write_checkpoint_file,
            s.settings.data_dir / MEMORY_CHECKPOINT,
            header,
            list(s.tables.values()),
        )


def _item_op_of(op: Op, table: Table) -> bool:
    """Whether ``op`` is one of ``table``'s item ops (those its pending index counts)."""
    return isinstance(op, PutOp | DeleteOp | PriorityOp) and op.table is table


def raise_into(op: Op, exc: BaseException) -> None:
    """Fail ``op``'s waiter with ``exc`` (the writer itself goes on)."""
    if op.future is not None and not op.future.done():
        op.future.set_exception(exc)


def index_fields_of(value: bytes, names: frozenset[str]) -> dict[str, Any]:
    """The top-level fields ``names`` of a msgpack map value (others and non-maps: absent)."""
    try:
        decoded = msgpack.unpackb(value, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData):
        return {}
    if not isinstance(decoded, dict):
        return {}
    return {name: decoded[name] for name in names if name in decoded}


def _write_checkpoint_file(path: Path, header: dict[str, Any], tables: list[Table]) -> None:
    """Write the snapshot (in the I/O thread: the writer, the only mutator, waits for it).

    The rows go through a 16 MiB file buffer, and the numeric columns are read as lists
    once per table: this thread needs the GIL between system calls, and with an 8 KiB
    buffer (a write every two 4 KiB values) each wait for the busy event loop made a
    snapshot of 5,000 items take 0.4 to 1 s instead of tens of milliseconds (measured).
    """
    tmp = path.with_suffix(".tmp")
    try:
        _write_rows(tmp, header, tables)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a half-written file would hold on to the space it took
        raise
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_rows(tmp: Path, header: dict[str, Any], tables: list[Table]) -> None:
    packer = msgpack.Packer(use_bin_type=True)
    with open(tmp, "wb", buffering=_SNAPSHOT_BUFFER) as f:
        f.write(packer.pack(header))
        for t in tables:
            n = len(t.keys)
            priority = t.priority[:n].tolist()
            inserted_at = t.inserted_at[:n].tolist()
            times_sampled = t.times_sampled[:n].tolist()
            order = t.order[:n].tolist()
            for slot, key in enumerate(t.keys):
                if key is not None:
                    row = (
                        t.tid,
                        key,
                        t.values[slot],
                        priority[slot],
                        inserted_at[slot],
                        times_sampled[slot],
                        order[slot],
                    )
                    f.write(packer.pack(row))
        f.flush()
        os.fsync(f.fileno())


def read_checkpoint_file(path: Path) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """The header and rows of a memory-mode checkpoint (blocking)."""
    with open(path, "rb") as f:
        unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=False, max_buffer_size=2**31 - 1)
        header = next(unpacker)
        rows = [tuple(row) for row in unpacker]
    return header, rows
