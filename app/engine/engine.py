"""The engine: tables of items over hybrid storage, changed only by one writer.

Reads (``get``, ``get_many``, ``sample``) run in the caller's task and merge each
table's pending ops, so a write is visible the moment it is accepted. Writes are
validated, logged (with ``durability="wal"``), registered in the pending index and
queued for the writer (:class:`workers.task_processor.TaskProcessor`); they return once
the log is fsynced, or once applied with ``wait=True``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import msgpack
import numpy as np

from app.engine.config import TableConfig
from app.engine.items import (
    MAX_KEY_BYTES,
    Item,
    ItemBatch,
    NewItem,
    SampleBatch,
    SampledItem,
    push_body_items,
)
from app.engine.ops import (
    CheckpointOp,
    CreateTableOp,
    DeleteOp,
    DropTableOp,
    Op,
    PopulateOp,
    PriorityOp,
    PutOp,
)
from app.engine.state import EngineState, cache_charge, value_key
from app.engine.table import Table, TablesSummary, summarize_tables
from app.engine.wal import LogRecoveryError, WriteAheadLog
from app.settings import Settings
from app.storage.allocator import tune_allocator
from app.storage.blocking import BlockingIO
from app.storage.cache import CacheLedger
from app.storage.faults import storage_error
from app.storage.rocks import LSN_KEY, META, NEXT_TID_KEY, RocksStore
from clients.errors import (
    DeadlineExceeded,
    Overloaded,
    ReplayError,
    StorageFull,
    TableExists,
    TableNotFound,
    Unavailable,
    ValidationFailed,
)
from workers.task_processor import (
    MEMORY_CHECKPOINT,
    TaskProcessor,
    index_fields_of,
    read_checkpoint_file,
)

log = logging.getLogger(__name__)

TABLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
DEFAULT_TIMEOUT_S = 10.0
# A value read from RocksDB is populated back into the cache only if it takes at most
# 1/POPULATE_FRACTION of the cache: bigger ones would only push out a crowd of others.
POPULATE_FRACTION = 8
_REPLAY_YIELD_EVERY = 16  # log records replayed between turns given to the event loop


class Engine:
    """Tables of items over hybrid storage, mutated by one writer task.

    Lifetime: ``await engine.start()`` recovers from ``settings.data_dir`` and starts the
    writer; ``await engine.stop()`` (idempotent) applies what is queued, checkpoints and
    closes. Until ``start`` has finished, every table and item call raises
    :class:`~clients.errors.Unavailable` (and :attr:`ready` is False). Errors are those of
    :mod:`clients.errors`.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._state: EngineState | None = None
        self._processor: TaskProcessor | None = None
        self._rng = np.random.default_rng(settings.seed)
        self._ready = False
        self._open = False  # recovery finished: table and item calls are served
        self._stopping = False
        self._recovered_records = 0

    # -- lifetime -------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """True once recovery finished and the writer runs."""
        return self._ready and self._processor is not None and self._processor.running

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
        if st.backup_url or st.restore != "none":
            log.warning("snapshots to --backup-url and --restore are not implemented yet; ignored")
        tune_allocator()
        io = BlockingIO(threads=st.io_threads)
        state = EngineState(
            settings=st, io=io, ledger=CacheLedger(limit_bytes=st.cache_limit_bytes)
        )
        self._state = state
        processor = TaskProcessor(state, p0_probability=st.p0_probability, seed=st.seed)
        self._processor = processor
        opened: list[WriteAheadLog] = []
        records: list[Any] = []
        try:
            covered = 0
            if st.storage_mode != "memory":
                state.store = await io.run(RocksStore, st.data_dir / "rocksdb")
                covered = await self._load_store(state)
            elif st.durability == "wal" and (st.data_dir / MEMORY_CHECKPOINT).exists():
                covered = await self._load_memory_checkpoint(state)
            processor.horizon = covered
            if st.durability == "wal":
                wal = WriteAheadLog(
                    st.data_dir / "wal",
                    io=io,
                    group_commit_s=st.wal_group_commit_ms / 1000,
                    writer=st.wal_writer,
                )
                opened.append(wal)
                strict = st.wal_recovery == "strict"
                records = await io.run(lambda: list(wal.replay(covered, strict=strict)))
                for i, record in enumerate(records):
                    try:
                        op = self._op_from_record(state, record)
                    except (ValueError, TypeError, KeyError, IndexError) as exc:
                        problem = f"log record {record[0]} cannot be applied: {exc}"
                        if strict:
                            raise LogRecoveryError(
                                problem + " (--wal-recovery point-in-time skips it)"
                            ) from exc
                        log.error("%s: skipped (point-in-time recovery)", problem)
                        continue
                    if op is not None:
                        try:
                            await processor.apply(op, replay=True)
                        except (ValueError, TypeError, KeyError, IndexError) as exc:
                            problem = (
                                f"log record {record[0]} ({record[1]} on {record[2]!r}) "
                                f"cannot be applied: {exc!r}"
                            )
                            if strict:
                                raise LogRecoveryError(
                                    problem + " (--wal-recovery point-in-time skips it)"
                                ) from exc
                            log.error("%s: skipped (point-in-time recovery)", problem)
                    if i % _REPLAY_YIELD_EVERY == _REPLAY_YIELD_EVERY - 1:
                        await asyncio.sleep(0)  # let the loop answer probes
                await io.run(wal.open, covered)
                state.wal = wal
                state.seq = wal.next_lsn - 1
                self._recovered_records = len(records)
                await processor.trim_all()
                if records:
                    await processor.checkpoint(full=True)
        except BaseException:
            await self._release(state, opened)
            raise
        for table in state.tables.values():
            table.visible = len(table.index)
            table.applied(state.seq, 0)
        processor.start()
        for name, config in (tables or {}).items():
            await self._ensure_table(name, config)
        self._open = self._ready = True
        log.info(
            "engine ready: mode=%s durability=%s tables=%d replayed=%d",
            st.storage_mode,
            st.durability,
            len(state.tables),
            len(records) if st.durability == "wal" else 0,
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
            if state.store is not None:
                await state.io.run(state.store.close)
            state.io.close()

    async def _release(self, state: EngineState, opened: list[WriteAheadLog]) -> None:
        """After a failed start: let go of the log's lock, RocksDB and the threads, so the
        data directory can be opened again (by a fixed start, in the same process)."""
        for wal in opened:
            with contextlib.suppress(OSError):
                await state.io.run(wal.close)
        if state.store is not None:
            await state.io.run(state.store.close)
        state.io.close()

    async def _load_store(self, state: EngineState) -> int:
        store = state.store
        assert store is not None

        def load() -> tuple[int, int, list[Table]]:
            """The tables RocksDB holds, their items restored (in an I/O thread: a big
            table takes seconds, and the event loop answers probes meanwhile)."""
            raw_lsn = store.get(LSN_KEY)
            raw_tid = store.get(NEXT_TID_KEY)
            tables = []
            cut = 5  # b"m" + 4-byte table id
            for key, value in store.scan(b"t"):
                rec = msgpack.unpackb(value, raw=False)
                tid = int(rec["id"])
                table = Table(key[1:].decode(), tid, TableConfig.model_validate(rec["config"]))
                rows = []
                fields: list[dict[str, Any]] = []
                for raw_key, raw_meta in store.scan(b"m" + tid.to_bytes(4, "big")):
                    prio, ts, sampled, size, order = META.unpack_from(raw_meta)
                    rows.append((raw_key[cut:].decode(), None, prio, ts, sampled, size, order))
                    if table.index_fields:
                        extra = raw_meta[META.size :]
                        fields.append(msgpack.unpackb(extra, raw=False) if extra else {})
                _restore_rows(state, table, rows, on_disk=True, fields=fields)
                tables.append(table)
            return (
                int.from_bytes(raw_lsn, "big") if raw_lsn else 0,
                int.from_bytes(raw_tid, "big") if raw_tid else 1,
                tables,
            )

        covered, next_tid, tables = await state.io.run(load)
        state.next_tid = next_tid
        for table in tables:
            state.tables[table.name] = table
            state.next_tid = max(state.next_tid, table.tid + 1)
        return int(covered)

    async def _load_memory_checkpoint(self, state: EngineState) -> int:
        def load() -> tuple[dict[str, Any], list[Table]]:
            """The checkpoint's tables, their items restored (in an I/O thread)."""
            header, rows = read_checkpoint_file(self.settings.data_dir / MEMORY_CHECKPOINT)
            by_tid: dict[int, list[tuple[Any, ...]]] = {}
            for tid, key, value, prio, ts, sampled, order in rows:
                by_tid.setdefault(tid, []).append(
                    (key, value, prio, ts, sampled, len(value) + len(key), order)
                )
            tables = []
            for spec in header["tables"]:
                config = TableConfig.model_validate(spec["config"])
                table = Table(spec["name"], int(spec["id"]), config)
                mine = by_tid.get(table.tid, [])
                fields = (
                    [index_fields_of(r[1], table.index_fields) for r in mine]
                    if table.index_fields
                    else []
                )
                _restore_rows(state, table, mine, on_disk=False, fields=fields)
                tables.append(table)
            return header, tables

        header, tables = await state.io.run(load)
        for table in tables:
            state.tables[table.name] = table
        state.next_tid = int(header["next_tid"])
        return int(header["lsn"])

    def _op_from_record(self, state: EngineState, record: list[Any]) -> Op | None:
        lsn, kind, name = record[0], record[1], record[2]
        if kind == "create":
            return CreateTableOp(lsn, name=name, config=TableConfig.model_validate(record[3]))
        table = state.tables.get(name)
        if table is None:
            raise KeyError(f"its table {name!r} does not exist at that point of the log")
        if kind == "put":
            _, _, _, keys, values, prios, ts = record
            items = [NewItem(k, v, p) for k, v, p in zip(keys, values, prios, strict=True)]
            return PutOp(lsn, table=table, items=items, inserted_at=ts, weight=0)
        if kind == "putb":  # a push body as the client sent it
            _, _, _, ts, body = record
            return PutOp(lsn, table=table, items=push_body_items(body), inserted_at=ts, weight=0)
        if kind == "del":
            return DeleteOp(lsn, table=table, keys=record[3], weight=0)
        if kind == "pri":
            return PriorityOp(lsn, table=table, keys=record[3], priorities=record[4], weight=0)
        if kind == "drop":
            return DropTableOp(lsn, table=table)
        raise ValueError(f"unknown log record kind {kind!r}")

    # -- helpers --------------------------------------------------------------------------

    @property
    def _s(self) -> EngineState:
        if self._state is None:
            raise Unavailable("the engine is not started")
        if not self._open:
            raise Unavailable("not ready: recovering the tables from the data directory")
        return self._state

    def _writer(self) -> TaskProcessor:
        p = self._processor
        if p is None or not p.running or self._stopping:
            reason = "shutting down" if self._stopping else "the writer is not running"
            if p is not None and p.failure is not None:
                reason = f"the writer failed: {p.failure!r}"
            raise Unavailable(reason)
        return p

    def _table(self, name: str) -> Table:
        table = self._s.tables.get(name)
        if table is None or table.dropping:
            raise TableNotFound(f"no table {name!r}")
        return table

    @property
    def alive(self) -> bool:
        """False once the writer has died (an orchestrator should restart the process);
        True while recovering, serving or stopping."""
        p = self._processor
        return p is None or p.failure is None

    @property
    def writer_failure(self) -> str | None:
        """Why the writer died, if it did."""
        p = self._processor
        return None if p is None or p.failure is None else repr(p.failure)

    def _reserve(self, n: int, nbytes: int) -> None:
        s = self._s
        st = self.settings
        if (
            s.queued_items + n > st.write_queue_ops
            or s.queued_bytes + nbytes > st.write_queue_mb * 2**20
        ):
            if n > st.write_queue_ops or nbytes > st.write_queue_mb * 2**20:
                raise ValidationFailed(
                    f"a batch of {n} items / {nbytes} bytes can never fit the write queue "
                    f"({st.write_queue_ops} items, {st.write_queue_mb} MB)"
                )
            raise Overloaded("the write queue is full; retry shortly", retry_after=1.0)

    async def _committed(self, seq: int, fut: asyncio.Future[None] | None) -> None:
        """Wait until op ``seq`` is durable (and applied, with ``fut``). If its log flush
        failed, the op is refused: taken out of the queue and of every read before the
        contract's error (507 for a full disk, 503 otherwise) is raised."""
        wal = self._state.wal if self._state is not None else None
        if wal is not None:
            try:
                await wal.commit(seq)
            except OSError as exc:
                if self._processor is not None:
                    self._processor.drop_refused()
                if fut is not None and fut.done() and not fut.cancelled():
                    fut.exception()  # failed by drop_refused: answered here
                raise storage_error(exc, str(wal.folder)) from exc
        if fut is not None:
            await fut

    # -- tables ---------------------------------------------------------------------------

    async def create_table(self, name: str, config: TableConfig) -> bool:
        """True when created, False when it exists with the same config; TableExists otherwise."""
        if not TABLE_NAME.match(name):
            raise ValidationFailed(
                f"table name {name!r} must be 1-128 characters of letters, digits, '_', '.', '-'"
            )
        existing = self._s.tables.get(name)
        if existing is not None and not existing.dropping:
            if existing.config == config:
                return False
            raise TableExists(f"table {name!r} exists with another config")
        limit = self.settings.max_tables
        if sum(not t.dropping for t in self._s.tables.values()) >= limit:
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
        seq = self._state.next_seq(["create", name, config.to_wire()])
        writer.submit(CreateTableOp(seq, future=fut, weight=0, name=name, config=config))
        await self._committed(seq, fut)

    async def drop_table(self, name: str) -> None:
        """Delete the table and its data; TableNotFound when missing."""
        table = self._table(name)
        writer = self._writer()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        seq = self._s.next_seq(["drop", name])
        table.dropping = True  # until the drop is applied (or refused), calls find no table
        writer.submit(DropTableOp(seq, future=fut, weight=0, table=table))
        await self._committed(seq, fut)

    def table_names(self) -> list[str]:
        """Names of the tables, sorted."""
        return sorted(self._s.tables)

    def describe(self, name: str) -> dict[str, Any]:
        """``{"name", "config", "stats"}`` of a table; TableNotFound when missing."""
        return self._table(name).describe()

    def tables_summary(self, largest: int | None) -> TablesSummary:
        """Every table's stats summed, and those of the ``largest`` biggest tables (all: None)."""
        s = self._s
        return summarize_tables(s.tables.values(), dropped=s.dropped_counters, largest=largest)

    # -- writes ---------------------------------------------------------------------------

    async def push(
        self,
        table: str,
        items: Sequence[NewItem],
        *,
        wait: bool = False,
        timeout_s: float | None = None,
        checked: bool = False,
        body: bytes | None = None,
    ) -> int:
        """Accept items; on return every reader sees them. With ``wait``, return once applied.

        ``checked=True`` skips the key and priority checks: the caller made them already
        (:func:`app.api.bodies.parse_push` does, with the same rules). ``body``: the msgpack
        push body ``items`` were decoded from by :func:`~app.engine.items.decode_push_body`,
        exactly those items; the log then keeps it as sent instead of encoding the items
        (measured over HTTP, 64 x 4 KiB: 36 µs less event-loop CPU per push of ~460).
        """
        t = self._table(table)
        writer = self._writer()
        if not items:
            return 0
        if checked:
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
        s = self._s
        if s.mode == "memory":
            need = s.ledger.bytes + s.queued_bytes + nbytes + n * cache_charge(0)
            if need > s.ledger.limit_bytes:
                raise StorageFull(
                    f"memory mode: {need} bytes would pass cache_memory_limit_mb "
                    f"({self.settings.cache_memory_limit_mb} MB)"
                )
        elif s.ledger.over and self._writer().storage_failing:
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
            seq = s.next_seq(["putb", table, now], body)
        else:
            keys = [it.key for it in items]
            values, priorities = [it.value for it in items], [it.priority for it in items]
            seq = s.next_seq(["put", table, keys, values, priorities, now])
        fut = asyncio.get_running_loop().create_future() if wait else None
        entries = {it.key: (seq, it, now) for it in items}
        t.visible += t.count_unseen(entries)
        t.pending.update(entries)
        t.accept(seq, n)
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

    async def delete(self, table: str, keys: Sequence[str], *, wait: bool = False) -> int:
        """Accept deletes of ``keys`` (missing ones are no-ops); visible to readers on return."""
        t = self._table(table)
        writer = self._writer()
        if not keys:
            return 0
        for key in keys:
            _check_key(key)
        self._reserve(len(keys), 0)
        seq, fut = self._enqueue_delete(writer, t, list(keys), wait=wait)
        await self._committed(seq, fut)
        return len(keys)

    def _enqueue_delete(
        self, writer: TaskProcessor, t: Table, keys: list[str], *, wait: bool
    ) -> tuple[int, asyncio.Future[None] | None]:
        s = self._s
        seq = s.next_seq(["del", t.name, keys] if s.wal is not None else None)
        fut = asyncio.get_running_loop().create_future() if wait else None
        doomed = {k: (seq, None, 0.0) for k in keys}
        t.visible -= sum(1 for key in doomed if t.contains(key))
        t.pending.update(doomed)
        t.accept(seq, len(keys))
        writer.submit(DeleteOp(seq, future=fut, weight=len(keys), table=t, keys=keys))
        if t.gate.limited:
            t.gate.notify()  # the visible size changed: limiter waiters look again
        return seq, fut

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
            if t.contains(key):
                keys.append(key)
                values.append(float(p))
        missing = len(priorities) - len(keys)
        if not keys:
            return 0, missing
        self._reserve(len(keys), 0)
        s = self._s
        seq = s.next_seq(["pri", table, keys, values] if s.wal is not None else None)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        t.accept(seq, len(keys))
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

    # -- reads ----------------------------------------------------------------------------

    async def get(self, table: str, key: str) -> Item | None:
        """The item as a reader sees it now, or None."""
        return (await self.get_many(table, [key]))[0]

    async def get_many(self, table: str, keys: Sequence[str]) -> list[Item | None]:
        """Items in the order asked, None where missing."""
        return (await self.get_batch(table, keys)).items()

    async def get_batch(self, table: str, keys: Sequence[str]) -> ItemBatch:
        """Items in the order asked, as columns (``values[i]`` None where missing)."""
        t = self._table(table)
        index, values = t.index, t.values
        if not t.pending:  # the common case: one vectorised pass over cached items
            slots = list(map(index.get, keys))
            if None not in slots:
                vals = list(map(values.__getitem__, slots))  # type: ignore[arg-type]
                if None not in vals:
                    sl = np.array(slots, dtype=np.int64)
                    nbytes = int(t.size[sl].sum())
                    if nbytes > self._max_answer_bytes:
                        raise self._too_big(nbytes, f"a batchGet of {len(keys)} keys")
                    t.referenced[sl] = 1
                    return ItemBatch(
                        keys, vals, t.priority[sl], t.inserted_at[sl], t.times_sampled[sl]
                    )
        out: list[Item | None] = [None] * len(keys)
        pending = t.pending
        misses: list[tuple[int, int, str]] = []
        for i, key in enumerate(keys):
            if pending:
                entry = pending.get(key)
                if entry is not None:
                    item = entry[1]
                    if item is not None:
                        out[i] = Item(key, item.value, item.priority, entry[2], 0)
                    continue
            slot = index.get(key)
            if slot is None:
                continue
            value = values[slot]
            if value is None:
                misses.append((i, slot, key))
                continue
            t.referenced[slot] = 1
            out[i] = Item(
                key,
                value,
                float(t.priority[slot]),
                float(t.inserted_at[slot]),
                int(t.times_sampled[slot]),
            )
        nbytes = sum(len(it.key) + len(it.value) for it in out if it is not None)
        nbytes += int(t.size[[slot for _, slot, _ in misses]].sum()) if misses else 0
        if nbytes > self._max_answer_bytes:
            raise self._too_big(nbytes, f"a batchGet of {len(keys)} keys")
        if misses:
            await self._read_misses(t, misses, out)
        return ItemBatch.of(keys, out)

    async def _read_misses(
        self, t: Table, misses: list[tuple[int, int, str]], out: list[Any]
    ) -> None:
        """Fill ``out[i]`` for values not in the cache, from RocksDB; schedules populates."""
        s = self._s
        assert s.store is not None
        metas = [
            (
                float(t.priority[slot]),
                float(t.inserted_at[slot]),
                int(t.times_sampled[slot]),
                int(t.version[slot]),
            )
            for _, slot, _ in misses
        ]
        found = await s.io.run(s.store.get_many, [value_key(t, key) for _, _, key in misses])
        writer = self._processor
        for (i, slot, key), meta, value in zip(misses, metas, found, strict=True):
            if value is None:  # deleted or replaced while we read: look again in memory
                if t.keys[slot] == key and t.values[slot] is not None:
                    value = t.values[slot]
                else:
                    continue
            elif (
                writer is not None
                and writer.running
                and cache_charge(len(value)) * POPULATE_FRACTION <= s.ledger.limit_bytes
            ):
                writer.submit(
                    PopulateOp(0, weight=0, table=t, slot=slot, version=meta[3], value=value),
                    p1=True,
                )
            assert value is not None
            out[i] = Item(key, value, meta[0], meta[1], meta[2])

    async def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_s: float | None = None,
        include_values: bool = True,
    ) -> list[SampledItem]:
        """Like :meth:`sample_batch`, as a list of :class:`SampledItem`."""
        batch = await self.sample_batch(
            table, batch_size, timeout_s=timeout_s, include_values=include_values
        )
        return batch.items()

    async def sample_batch(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_s: float | None = None,
        include_values: bool = True,
    ) -> SampleBatch:
        """``batch_size`` draws from the table's sampler, after its pending ops are applied.

        A table with no items makes the call wait up to ``timeout_s`` for one (as Reverb's
        default ``MinSize(1)``); the rate limiter may make it wait too. Past the timeout:
        :class:`DeadlineExceeded`.
        """
        if batch_size < 1:
            raise ValidationFailed(f"batch_size ({batch_size}) must be >= 1")
        t = self._table(table)
        timeout = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        if t.gate.limited:
            await t.gate.acquire_sample(batch_size, timeout)
        try:
            await self._caught_up(t, deadline, timeout)
            while len(t.sampler) == 0:
                left = deadline - time.monotonic()
                if left <= 0 or not await t.wait_nonempty(left):
                    raise DeadlineExceeded(
                        f"table {table!r} had no item to sample within {timeout:g} s"
                    )
                await self._caught_up(t, deadline, timeout)
            slots, probs, exhausted = self._draw(t, batch_size)
            if include_values:
                nbytes = int(t.size[slots].sum())
                if nbytes > self._max_answer_bytes:
                    self._undraw(t, slots, exhausted)
                    raise self._too_big(nbytes, f"a sample of {len(slots)} items")
        except BaseException:
            if t.gate.limited:
                t.gate.refund_sample(batch_size)
            raise
        size = len(t.sampler) + len(exhausted)
        t.counters.samples += len(slots)
        slot_list = slots.tolist()
        tkeys, tvalues = t.keys, t.values
        batch = SampleBatch(
            keys=cast("list[str]", list(map(tkeys.__getitem__, slot_list))),
            values=list(map(tvalues.__getitem__, slot_list))
            if include_values
            else [None] * len(slot_list),
            priorities=t.priority[slots],
            probabilities=probs,
            weights=t.sampler.weights(probs, size),
            times_sampled=t.times_sampled[slots],
        )
        if include_values:
            t.referenced[slots] = 1
            if None in batch.values:
                try:  # RocksDB reads wait behind checkpoints in the I/O threads: keep the deadline
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        await self._fill_sampled_misses(t, slot_list, batch)
                except TimeoutError:
                    self._undraw(t, slots, exhausted)
                    t.counters.samples -= len(slots)
                    if t.gate.limited:
                        t.gate.refund_sample(batch_size)
                    raise DeadlineExceeded(
                        f"table {table!r}: reading the sampled values from disk took more "
                        f"than {timeout:g} s"
                    ) from None
        if exhausted and not t.dropped and not t.dropping:  # no log record past its drop
            self._enqueue_delete(self._writer(), t, exhausted, wait=False)
        return batch

    async def _fill_sampled_misses(
        self, t: Table, slot_list: list[int], batch: SampleBatch
    ) -> None:
        """Read the values of picks not in the cache; drop picks deleted meanwhile."""
        values = batch.values
        misses = [(i, sl, batch.keys[i]) for i, sl in enumerate(slot_list) if values[i] is None]
        found: list[Any] = [None] * len(values)
        await self._read_misses(t, misses, found)
        for i, _, _ in misses:
            item = found[i]
            values[i] = None if item is None else item.value
        if None in values:  # deleted while read from RocksDB: leave those picks out
            keep = [i for i, v in enumerate(values) if v is not None]
            idx = np.asarray(keep, dtype=np.int64)
            batch.keys = [batch.keys[i] for i in keep]
            batch.values = [values[i] for i in keep]
            batch.priorities = batch.priorities[idx]
            batch.probabilities = batch.probabilities[idx]
            batch.weights = batch.weights[idx]
            batch.times_sampled = batch.times_sampled[idx]

    async def _caught_up(self, t: Table, deadline: float, waited_s: float) -> None:
        """Wait until the writer applied what was accepted for ``t``, by the deadline."""
        if t.applied_seq >= t.accepted_seq:
            return
        self._writer()  # Unavailable when it has died: nothing would ever catch up
        if not await t.caught_up(deadline - time.monotonic()):
            raise DeadlineExceeded(
                f"table {t.name!r}: the writes accepted before this sample were not applied "
                f"within {waited_s:g} s; retry"
            )

    @property
    def _max_answer_bytes(self) -> int:
        return int(self.settings.max_response_mb * 2**20)

    def _too_big(self, nbytes: int, what: str) -> ValidationFailed:
        return ValidationFailed(
            f"{what} would answer {nbytes / 2**20:.1f} MB of keys and values, past the "
            f"server's --max-response-mb ({self.settings.max_response_mb:g}); ask for fewer"
        )

    def _undraw(self, t: Table, slots: Any, exhausted: list[str]) -> None:
        """Take back a draw whose answer is refused: ``times_sampled`` as it was, and the
        items it retired back in selection (at the end of the remover's order)."""
        np.subtract.at(t.times_sampled, slots, 1)
        for key in exhausted:
            slot = t.index.get(key)
            if slot is None or not t.retired[slot]:
                continue
            t.retired[slot] = 0
            one = np.asarray([slot], dtype=np.int64)
            fields = [t.fields.get(slot, {})] if t.index_fields else None
            t.sampler.insert(one, t.priority[one], t.inserted_at[one], fields)
            if t.remover is not None:
                t.remover.insert(one, t.priority[one], t.inserted_at[one], fields)

    def _draw(self, t: Table, n: int) -> tuple[Any, Any, list[str]]:
        """Draw ``n`` picks; with ``max_times_sampled``, picks that use an item up retire it.

        Draws are Reverb's: one after another, each seeing the previous ones' effect, so a
        retired item is never handed out again (vectorised while nothing retires).
        """
        mts = t.config.max_times_sampled
        rng = self._rng
        if mts == 0:
            slots, probs = t.sampler.sample(n, rng)
            np.add.at(t.times_sampled, slots, 1)
            t.meta_dirty[slots] = 1
            return slots, probs, []
        got_slots: list[int] = []
        got_probs: list[float] = []
        exhausted: list[str] = []
        while len(got_slots) < n and len(t.sampler) > 0:
            slots, probs = t.sampler.sample(n - len(got_slots), rng)
            for slot, prob in zip(slots.tolist(), probs.tolist(), strict=True):
                if t.retired[slot]:
                    break  # the state changed under this draw: draw the rest again
                t.times_sampled[slot] += 1
                t.meta_dirty[slot] = 1
                got_slots.append(slot)
                got_probs.append(prob)
                if t.times_sampled[slot] >= mts:
                    one = np.asarray([slot], dtype=np.int64)
                    t.sampler.remove(one)
                    if t.remover is not None:
                        t.remover.remove(one)
                    t.retired[slot] = 1
                    key = t.keys[slot]
                    assert key is not None
                    exhausted.append(key)
        return np.asarray(got_slots, dtype=np.int64), np.asarray(got_probs), exhausted

    # -- introspection --------------------------------------------------------------------

    def queue_depths(self) -> dict[str, int]:
        """Ops waiting in the writer's queues, and the item ops and bytes they hold."""
        p = self._processor
        s = self._state
        return {
            "p0": len(p.p0) if p else 0,
            "p1": len(p.p1) if p else 0,
            "items": s.queued_items if s else 0,
            "bytes": s.queued_bytes if s else 0,
        }

    @property
    def writer_lag_s(self) -> float:
        """Seconds the oldest op not yet applied by the writer has waited."""
        return self._processor.lag_s if self._processor is not None else 0.0

    def storage_stats(self) -> dict[str, Any]:
        """Engine-wide figures for metrics: cache bytes and limit, log bytes, applied ops."""
        s = self._s
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


def _restore_rows(
    state: EngineState,
    table: Table,
    rows: list[tuple[Any, ...]],
    *,
    on_disk: bool,
    fields: list[dict[str, Any]],
) -> None:
    """Load recovered items (key, value or None, priority, inserted_at, times_sampled, size,
    order), handing them to the selectors in their original insertion order."""
    if not rows:
        return
    by_order = sorted(range(len(rows)), key=lambda i: rows[i][6])
    rows = [rows[i] for i in by_order]
    if fields:
        fields = [fields[i] for i in by_order]
    slots = np.empty(len(rows), dtype=np.int64)
    cached: list[int] = []
    charges: list[int] = []
    for i, (key, value, prio, ts, sampled, size, order) in enumerate(rows):
        slot = table.alloc_slot(key)
        slots[i] = slot
        table.order[slot] = order
        table.priority[slot] = prio
        table.inserted_at[slot] = ts
        table.times_sampled[slot] = sampled
        table.size[slot] = size
        table.version[slot] += 1
        if on_disk:
            table.on_disk[slot] = 1
            table.disk_size[slot] = size
            table.bytes_on_disk += size
        else:
            table.values[slot] = value
            table.dirty[slot] = 1
            cached.append(slot)
            charges.append(cache_charge(size))
            table.bytes_in_cache += size
    if cached:
        state.ledger.add_many(table, cached, charges)
    table.next_order = int(table.order[slots].max()) + 1
    given = fields if table.index_fields else None
    if given is not None:
        table.fields.update(zip(slots.tolist(), given, strict=True))
    table.sampler.insert(slots, table.priority[slots], table.inserted_at[slots], given)
    if table.remover is not None:
        table.remover.insert(slots, table.priority[slots], table.inserted_at[slots], given)
