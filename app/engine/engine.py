"""The engine: tables of items over hybrid storage, changed only by one writer.

Reads (``get``, ``get_many``, ``sample``) run in the caller's task and merge each
table's pending ops, so a write is visible the moment it is accepted. Writes are
validated, logged (with ``durability="wal"``), registered in the pending index and
queued for the writer (:class:`rlreplay.workers.task_processor.TaskProcessor`); they return once
the log is fsynced, or once applied with ``wait=True``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rlreplay.app.engine.claims import LeaseExpiry
from rlreplay.app.engine.core import DEFAULT_TIMEOUT_S
from rlreplay.app.engine.recovery import recover, release
from rlreplay.app.engine.rollouts import EngineRollouts
from rlreplay.app.engine.snapshots import SnapshotInfo, Snapshots, restore_on_start
from rlreplay.app.log import records
from rlreplay.app.storage.allocator import tune_allocator
from rlreplay.app.storage.blocking import BlockingIO
from rlreplay.app.storage.cache import CacheLedger
from rlreplay.app.storage.faults import storage_error
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import (
    MAX_KEY_BYTES,
    NewItem,
)
from rlreplay.app.tables.stats import TablesSummary, describe, summarize_tables
from rlreplay.app.tables.table import Table
from rlreplay.wire.errors import (
    ReplayError,
    StorageFull,
    TableExists,
    Unavailable,
    ValidationFailed,
)
from rlreplay.workers.ops import (
    CheckpointOp,
    CreateTableOp,
    DropTableOp,
    PriorityOp,
    PutOp,
)
from rlreplay.workers.request_ids import Answer, answer_count
from rlreplay.workers.state import EngineState, cache_charge
from rlreplay.workers.storage import storage_for
from rlreplay.workers.task_processor import TaskProcessor

log = logging.getLogger(__name__)

TABLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class Engine(EngineRollouts):
    """Tables of items over hybrid storage, mutated by one writer task.

    Lifetime: ``await engine.start()`` recovers from ``settings.data_dir`` and starts the
    writer; ``await engine.stop()`` (idempotent) applies what is queued, checkpoints and
    closes. Until ``start`` has finished, every table and item call raises
    :class:`~rlreplay.wire.errors.Unavailable` (and :attr:`ready` is False). Errors are those of
    :mod:`rlreplay.wire.errors`.
    """

    # -- lifetime -------------------------------------------------------------------------

    async def start(self, tables: Mapping[str, TableConfig] | None = None) -> None:
        """Recover tables from the data directory, replay the log, start the writer.

        Args:
            tables: Tables to create if recovery did not bring them back (the ``default``
                table), before any call is served. One recovered with another config is
                kept as it is, with a warning.

        The event loop stays free during recovery (a server answers ``/healthz`` meanwhile):
        the blocking parts run in I/O threads, and the log's replay yields between records.
        """
        st = self.settings
        st.data_dir.mkdir(parents=True, exist_ok=True)
        tune_allocator()
        io = BlockingIO(threads=st.io_threads)
        stop_restore = threading.Event()
        try:
            restored = await io.run(restore_on_start, st, self.recovery, stop_restore)
        except BaseException:  # cancelled (SIGTERM): the download stops and is removed
            stop_restore.set()
            io.close()
            raise
        state = EngineState(
            settings=st,
            io=io,
            ledger=CacheLedger(limit_bytes=st.cache_limit_bytes),
            storage=storage_for(st.storage_mode),
        )
        self._state = state
        processor = TaskProcessor(state, urgent_probability=st.urgent_probability, seed=st.seed)
        self._processor = processor
        try:
            self._recovered_records = await recover(
                state, processor, restored=bool(restored), progress=self.recovery
            )
        except BaseException:
            await release(state)
            raise
        for table in state.tables.values():
            table.pending.recount_visible()
            table.pending.applied(state.seq, 0)
        processor.start()
        self.snapshots = Snapshots(st, processor, state)
        only = restored.meta.get("only_tables") if restored is not None else None
        if only is not None:  # a snapshot of some tables brings back those alone
            for name in [n for n in state.tables if n not in only]:
                await self._drop(state.tables[name])
        for name, config in (tables or {}).items():
            await self._ensure_table(name, config)
        await self.snapshots.start()
        self._leases = LeaseExpiry()
        self._leases.start()
        self._open = self._ready = True
        log.info(
            "engine ready: mode=%s durability=%s tables=%d replayed=%d",
            st.storage_mode,
            st.durability,
            len(state.tables),
            self._recovered_records,
        )

    async def stop(self) -> None:
        """Apply what is queued, checkpoint, close storage; idempotent.

        With the log on, the queue and the final checkpoint get ``stop_timeout_s`` together
        (what they leave is in the log, replayed at the next start), so a stop on a failing
        disk still ends. With ``durability="none"`` the final checkpoint is all there is, and
        it is waited for.
        """
        if self._stopping or self._state is None:
            return
        self._stopping = True
        self._ready = False
        state, processor = self._state, self._processor
        assert processor is not None
        budget = self.settings.stop_timeout_s if state.wal is not None else None
        deadline = None if budget is None else time.monotonic() + budget
        try:
            if self._leases is not None:
                await self._leases.stop()
            if self.snapshots is not None:
                await self.snapshots.stop()
            if processor.running:
                if state.wal is not None or state.store is not None:
                    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    processor.submit(CheckpointOp(0, future=fut, weight=0, full=True))
                    try:
                        await asyncio.wait_for(fut, budget)
                    except (ReplayError, TimeoutError) as exc:
                        log.warning("no final checkpoint (%s): the log keeps what it covers", exc)
            left = None if deadline is None else max(0.5, deadline - time.monotonic())
            await processor.stop(timeout_s=left)
        finally:
            if state.wal is not None:
                await state.wal.drain()
                await state.io.run(state.wal.close)
            await state.storage.close(state.io)
            state.io.close()

    # -- tables ---------------------------------------------------------------------------

    async def create_table(self, name: str, config: TableConfig) -> bool:
        """True when created, False when it exists with the same config; TableExists otherwise."""
        if not TABLE_NAME.match(name):
            raise ValidationFailed(
                f"table name {name!r} must be 1-128 characters of letters, digits, '_', '.', '-'"
            )
        existing = self.state.tables.get(name)
        if existing is not None and not existing.dropping:
            if existing.config == config:
                return False
            raise TableExists(f"table {name!r} exists with another config")
        limit = self.settings.max_tables
        if sum(not t.dropping for t in self.state.tables.values()) >= limit:
            raise StorageFull(f"the server holds {limit} tables, its --max-tables: drop one first")
        await self._create(name, config)
        return True

    async def _ensure_table(self, name: str, config: TableConfig) -> None:
        """At start-up: create ``name`` unless recovery brought it back."""
        assert self._state is not None
        existing = self._state.tables.get(name)
        if existing is None:
            await self._create(name, config)
        elif existing.config != config:
            log.warning(
                "the table %r exists with another config (recovered from the data dir); "
                "keeping it as it is",
                name,
            )

    async def _create(self, name: str, config: TableConfig) -> None:
        assert self._state is not None
        try:
            probe = Table(name, 0, config)
        except ValueError as exc:
            raise ValidationFailed(str(exc)) from exc
        for warning in probe.gate.problems(config.max_size, config.max_times_sampled):
            log.warning("table %r: %s", name, warning)
        writer = self._writer()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        seq = self._state.next_seq(records.create_table(name, config.to_wire()))
        writer.submit(CreateTableOp(seq, future=fut, weight=0, name=name, config=config))
        await self._committed(seq, fut)

    async def drop_table(self, name: str) -> None:
        """Delete the table and its data; TableNotFound when missing."""
        await self._drop(self._table(name))

    async def _drop(self, table: Table) -> None:
        assert self._state is not None
        writer = self._writer()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        seq = self._state.next_seq(records.drop_table(table.name))
        table.mark_dropping()  # until the drop is applied (or refused), calls find no table
        writer.submit(DropTableOp(seq, future=fut, weight=0, table=table))
        await self._committed(seq, fut)

    # -- snapshots ------------------------------------------------------------------------

    def _snapshots(self) -> Snapshots:
        self._writer()  # Unavailable while recovering, stopping, or with the writer dead
        assert self.snapshots is not None
        return self.snapshots

    async def take_snapshot(self, tables: Sequence[str] | None = None) -> SnapshotInfo:
        """Snapshot every table (or ``tables``) to the backup URL; see :class:`Snapshots`."""
        self.state  # noqa: B018 - Unavailable until recovery is done
        return await self._snapshots().take(tables)

    async def list_snapshots(self) -> list[SnapshotInfo]:
        """The complete snapshots at the backup URL, newest first."""
        self.state  # noqa: B018
        return await self._snapshots().list()

    def snapshot_stats(self) -> dict[str, float] | None:
        """Snapshot figures for ``/metrics`` (None: no backup URL)."""
        s = self.snapshots
        return s.stats() if s is not None and s.configured else None

    def table_names(self) -> list[str]:
        """Names of the tables, sorted."""
        return sorted(self.state.tables)

    def describe(self, name: str) -> dict[str, Any]:
        """``{"name", "config", "stats"}`` of a table; TableNotFound when missing."""
        return describe(self._table(name))

    def tables_summary(self, largest: int | None) -> TablesSummary:
        """Every table's stats summed, and those of the ``largest`` biggest tables (all: None)."""
        s = self.state
        return summarize_tables(s.tables.values(), dropped=s.dropped_counters, largest=largest)

    # -- writes ---------------------------------------------------------------------------

    async def push(
        self,
        table: str,
        items: Sequence[NewItem],
        *,
        wait: bool = False,
        timeout_s: float | None = None,
        validated: bool = False,
        body: bytes | None = None,
        request_id: str | None = None,
        columns: bytes | memoryview | None = None,
    ) -> int:
        """Accept items; on return every reader sees them. With ``wait``, return once applied.

        ``validated=True`` skips the key and priority checks: the caller made them already
        (:func:`rlreplay.app.api.bodies.parse_push` does, with the same rules). ``body``: the
        msgpack push body ``items`` were decoded from
        (:class:`~rlreplay.wire.schemas.PushRequest`; the log's replay reads it back with
        :func:`~rlreplay.app.tables.items.push_body_items`), exactly those items; the log
        then keeps it as sent instead of encoding the items again on the event loop (commit
        998e94e has the figures).
        ``request_id``: a repeat of it within the window changes nothing (the count of the
        first answer is returned). ``columns``: the msgpack ``columns`` map of the columnar
        push body ``items`` were built from in order (by
        :func:`~rlreplay.app.tables.unstacking.unstack_values`, which replay runs on it
        again); the log keeps it as sent, with the keys and priorities, instead of every
        value.
        """
        if request_id is None:
            return await self._push(table, items, wait, timeout_s, validated, body, None, columns)
        _status, answer = await self.push_answer(
            table,
            items,
            wait=wait,
            timeout_s=timeout_s,
            validated=validated,
            body=body,
            request_id=request_id,
            columns=columns,
        )
        return answer_count(answer)

    async def push_answer(
        self,
        table: str,
        items: Sequence[NewItem],
        *,
        wait: bool = False,
        timeout_s: float | None = None,
        validated: bool = False,
        body: bytes | None = None,
        request_id: str | None = None,
        columns: bytes | memoryview | None = None,
    ) -> Answer:
        """:meth:`push`, answered as the contract says: ``(200, {"committed": n})`` or
        ``(202, {"accepted": n})``; a repeat of ``request_id`` gets the first answer, status
        included, whatever its own ``wait``."""
        if request_id is None:
            n = await self._push(table, items, wait, timeout_s, validated, body, None, columns)
            return (200, {"committed": n}) if wait else (202, {"accepted": n})
        n = len(items)

        async def serve(request: list[Any] | None) -> Answer:
            answer: Answer = (200, {"committed": n}) if wait else (202, {"accepted": n})
            if request is not None:
                request[1:3] = list(answer)
            await self._push(table, items, wait, timeout_s, validated, body, request, columns)
            return answer

        return await self.once("push", request_id, serve)

    async def _push(
        self,
        table: str,
        items: Sequence[NewItem],
        wait: bool,
        timeout_s: float | None,
        validated: bool,
        body: bytes | None,
        request: list[Any] | None,
        columns: bytes | memoryview | None = None,
    ) -> int:
        t = self._table(table)
        if t.config.max_staleness is not None:
            fresh = self.fresh_items(t, items)
            if len(fresh) < len(items):  # the log must not bring the stale ones back
                items, body, columns = fresh, None, None
        writer = self._writer()
        if not items and request is None:
            return 0
        if validated:
            nbytes = sum([len(it.value) for it in items])
        else:
            nbytes = 0
            for it in items:
                _check_key(it.key)
                p = it.priority
                if not (p >= 0 and math.isfinite(p)):
                    raise ValidationFailed(
                        f"priority ({p}) of key {it.key!r} must be a finite float >= 0"
                    )
                nbytes += len(it.value)
        n = len(items)
        self._reserve(n, nbytes)
        s = self.state
        if request is not None and not n:  # the id alone is logged
            seq = s.next_seq(records.put(table, [], [], [], 0.0, {"request": request}))
            await self._committed(seq, None)
            return 0
        if s.storage.capped:
            need = s.ledger.bytes + s.queued_bytes + nbytes + n * cache_charge(0)
            if need > s.ledger.limit_bytes:
                raise StorageFull(
                    f"memory mode: {need} bytes would pass cache_memory_limit_mb "
                    f"({self.settings.cache_memory_limit_mb} MB)"
                )
        elif s.ledger.over and self._writer().storage_failing:
            if self.storage_damage is not None:  # not a state that passes: 500, not 507
                raise storage_error(self.storage_damage, str(self.settings.data_dir))
            raise StorageFull(
                f"the cache is full and cannot move values to disk in "
                f"{self.settings.data_dir}: {self._writer().last_background_error}"
            )
        if t.gate.limited:
            await t.gate.acquire_insert(n, DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
            try:
                self._reserve(n, nbytes)
                self._table(table)
            except BaseException:
                t.gate.refund_insert(n)
                raise
        now = time.time()
        if s.wal is None:
            seq = s.next_seq(None)
        elif body is not None:
            seq = s.next_seq(records.push_body(table, now), body)
        else:
            keys, priorities = [it.key for it in items], [it.priority for it in items]
            extras: dict[str, Any] = {}
            if any(it.group is not None or it.version is not None for it in items):
                extras["groups"] = [it.group for it in items]
                extras["versions"] = [it.version for it in items]
            if request is not None:
                extras["request"] = request
            # a columnar push's items have no group or version: its columns say it all
            if columns is not None and "groups" not in extras:
                record = records.push_columns(table, keys, priorities, now, extras)
                seq = s.next_seq(record, columns)
            else:
                values = [it.value for it in items]
                seq = s.next_seq(records.put(table, keys, values, priorities, now, extras))
        fut = asyncio.get_running_loop().create_future() if wait else None
        entries = {it.key: (seq, it, now) for it in items}
        t.pending.admit_puts(seq, entries, n)
        writer.submit(
            PutOp(seq, future=fut, weight=n, nbytes=nbytes, table=t, items=items, inserted_at=now)
        )
        try:
            await self._committed(seq, fut)
        except (StorageFull, Unavailable):
            if t.gate.limited and s.wal is not None and s.wal.refusal(seq) is not None:
                t.gate.refund_insert(n)
            raise
        return n

    async def delete(
        self,
        table: str,
        keys: Sequence[str],
        *,
        wait: bool = False,
        request_id: str | None = None,
    ) -> int:
        """Accept deletes of ``keys`` (missing ones are no-ops); visible to readers on return.
        ``request_id``: a repeat of it within the window changes nothing."""
        _status, answer = await self.delete_answer(table, keys, wait=wait, request_id=request_id)
        return answer_count(answer)

    async def delete_answer(
        self,
        table: str,
        keys: Sequence[str],
        *,
        wait: bool = False,
        request_id: str | None = None,
    ) -> Answer:
        """:meth:`delete`, answered as :meth:`push_answer` is."""
        n = len(keys)

        async def serve(request: list[Any] | None) -> Answer:
            answer: Answer = (200, {"committed": n}) if wait else (202, {"accepted": n})
            if request is not None:
                request[1:3] = list(answer)
            t = self._table(table)
            writer = self._writer()
            if not keys and request is None:
                return answer
            for key in keys:
                _check_key(key)
            self._reserve(len(keys), 0)
            seq, fut = self._enqueue_delete(writer, t, list(keys), wait=wait, request=request)
            await self._committed(seq, fut)
            return answer

        return await self.once("delete", request_id, serve)

    async def update_priorities(
        self, table: str, priorities: Mapping[str, float]
    ) -> tuple[int, int]:
        """Set priorities of existing keys, once applied; returns (updated, missing)."""
        t = self._table(table)
        writer = self._writer()
        keys, values = [], []
        for key, p in priorities.items():
            _check_key(key)
            if not (p >= 0 and math.isfinite(p)):
                raise ValidationFailed(f"priority ({p}) of key {key!r} must be a finite float >= 0")
            if t.pending.is_visible(key):
                keys.append(key)
                values.append(float(p))
        missing = len(priorities) - len(keys)
        if not keys:
            return 0, missing
        self._reserve(len(keys), 0)
        s = self.state
        seq = s.next_seq(records.priorities(table, keys, values) if s.wal is not None else None)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        t.pending.accept(seq, len(keys))
        writer.submit(
            PriorityOp(seq, future=fut, weight=len(keys), table=t, keys=keys, priorities=values)
        )
        await self._committed(seq, fut)
        return len(keys), missing

    async def flush(self) -> None:
        """Checkpoint: what is applied goes to RocksDB (or the memory checkpoint); log truncated."""
        writer = self._writer()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        writer.submit(CheckpointOp(0, future=fut, weight=0))
        await fut

    # -- introspection --------------------------------------------------------------------

    def queue_depths(self) -> dict[str, int]:
        """Ops waiting in the writer's queues, and the item ops and bytes they hold."""
        p = self._processor
        s = self._state
        return {
            "urgent": len(p.urgent) if p else 0,
            "housekeeping": len(p.housekeeping) if p else 0,
            "items": s.queued_items if s else 0,
            "bytes": s.queued_bytes if s else 0,
        }

    @property
    def writer_lag_s(self) -> float:
        """Seconds the oldest op not yet applied by the writer has waited."""
        return self._processor.lag_s if self._processor is not None else 0.0

    def storage_stats(self) -> dict[str, Any]:
        """Engine-wide figures for metrics: cache bytes and limit, log bytes, applied ops."""
        s = self.state
        return {
            "cache_bytes": s.ledger.bytes,
            "cache_limit_bytes": s.ledger.limit_bytes,
            "cache_entries": len(s.ledger),
            "wal_bytes": s.wal.disk_bytes() if s.wal is not None else 0,
            "applied_ops": self._processor.applied_ops if self._processor else 0,
            "recovered_records": self._recovered_records,
            "writer_alive": int(self.alive),
            "storage_failing": int(
                self._processor is not None
                and (
                    self._processor.storage_failing
                    or (s.wal is not None and s.wal.last_error is not None)
                )
            ),
            "data_lost": dict(s.data_loss.counts),
            "failures": {
                "log_flush": s.wal.flush_failures if s.wal is not None else 0,
                **(self._processor.background_failures if self._processor else {}),
            },
        }


def _check_key(key: str) -> None:
    if (
        not isinstance(key, str)
        or not key
        or (len(key) > MAX_KEY_BYTES // 4 and len(key.encode()) > MAX_KEY_BYTES)
    ):
        raise ValidationFailed(
            f"key must be a string of 1 to {MAX_KEY_BYTES} bytes of UTF-8"
            + (f", got {len(key.encode())} bytes" if isinstance(key, str) and key else "")
        )
