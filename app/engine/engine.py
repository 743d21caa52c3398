"""The engine: tables of items over hybrid storage, changed only by one writer.

:class:`Engine` is a façade over parts that each own one concern and take their
collaborators in their constructors, all sharing one :class:`EngineCore` (the state, the
writer, the checks):

- ``engine.admission`` (:class:`~rlreplay.app.engine.admission.Admission`): writes of items,
  checked, logged and queued for the writer;
- ``engine.reads`` (:class:`~rlreplay.app.engine.reads.Reads`): get, batchGet and sample, in
  the caller's task;
- ``engine.claims`` (:class:`~rlreplay.app.engine.claims.Claims`): patches, claims, acks,
  releases and policy versions, with the lease expiry and field-learning tasks it owns;
- ``engine.episodes`` (:class:`~rlreplay.app.engine.episodes.Episodes`): appends to,
  deletes and reads of the episodes of episode tables;
- ``engine.windows`` (:class:`~rlreplay.app.engine.windows.Windows`): window samples and
  window priorities of episode tables, in the caller's task;
- ``engine.snapshots`` (:class:`~rlreplay.app.engine.snapshots.Snapshots`, once started).

The engine itself owns the lifetime (``start``/``stop``) and the tables (create, drop,
describe); its other methods forward to a part with the part's own signature, for tests,
benchmarks and embedders (the routes call the parts: ``engine.reads.sample_batch(...)``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rlreplay.app.engine.admission import Admission, WriteAnswer
from rlreplay.app.engine.claim_shape import ClaimShape
from rlreplay.app.engine.claims import ClaimedItem, Claims
from rlreplay.app.engine.core import EngineCore
from rlreplay.app.engine.episodes import Episodes
from rlreplay.app.engine.item_expiry import ItemExpiry
from rlreplay.app.engine.loop_watchdog import LoopWatchdog
from rlreplay.app.engine.reads import Reads
from rlreplay.app.engine.recovery import recover, release
from rlreplay.app.engine.reservations import ReservationDesk
from rlreplay.app.engine.snapshots import SnapshotInfo, Snapshots, restore_on_start
from rlreplay.app.engine.windows import Windows
from rlreplay.app.log import records
from rlreplay.app.progress import RecoveryProgress
from rlreplay.app.settings import Settings
from rlreplay.app.storage.cache import CacheLedger
from rlreplay.app.storage.faults import StorageDamaged
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import (
    Item,
    ItemBatch,
    NewItem,
    SampleBatch,
    SampledItem,
)
from rlreplay.app.tables.rollouts import Lease
from rlreplay.app.tables.stats import TablesSummary, describe, summarize_tables
from rlreplay.app.tables.table import Table
from rlreplay.app.tables.tag_index import Condition
from rlreplay.app.tables.waits import end_waits
from rlreplay.app.writer.checkpoints import CheckpointStats
from rlreplay.app.writer.ops import (
    CheckpointOp,
    CreateTableOp,
    DropTableOp,
)
from rlreplay.app.writer.state import EngineState
from rlreplay.app.writer.storage import storage_for
from rlreplay.app.writer.task_processor import TaskProcessor
from rlreplay.wire.errors import (
    ReplayError,
    StorageFull,
    TableExists,
    Unavailable,
    ValidationFailed,
)
from rlreplay.workers.blocking import BlockingIO

log = logging.getLogger(__name__)

TABLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class Engine:
    """Tables of items over hybrid storage, mutated by one writer task.

    Lifetime: ``await engine.start()`` recovers from ``settings.data_dir`` and starts the
    writer; ``await engine.stop()`` (idempotent) applies what is queued, checkpoints and
    closes. Until ``start`` has finished, every table and item call raises
    :class:`~rlreplay.wire.errors.Unavailable` (and :attr:`ready` is False). Errors are those of
    :mod:`rlreplay.wire.errors`.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.core = EngineCore(settings)
        self.admission = Admission(self.core)
        self.reads = Reads(self.core)
        self.claims = Claims(self.core, self.reads, self.admission)
        self.reservations = ReservationDesk(self.core)
        self.item_expiry = ItemExpiry(self.core)
        self.windows = Windows(self.core, self.reads)
        self.episodes = Episodes(self.core, self.admission)
        #: Snapshots to the backup URL (set once recovery is done).
        self.snapshots: Snapshots | None = None
        #: Logs the stack of long event-loop stalls (``--log-loop-stalls-ms``).
        self.loop_watchdog = (
            LoopWatchdog(settings.log_loop_stalls_ms / 1e3) if settings.log_loop_stalls_ms else None
        )

    # -- the core's state -----------------------------------------------------------------

    @property
    def recovery(self) -> RecoveryProgress:
        """How far the start-up's restore and log replay are (``/metrics``)."""
        return self.core.recovery

    @property
    def ready(self) -> bool:
        """True once recovery finished and the writer runs."""
        return self.core.ready

    @property
    def alive(self) -> bool:
        """False once the writer has died; see :attr:`EngineCore.alive`."""
        return self.core.alive

    @property
    def state(self) -> EngineState:
        """The state served; Unavailable until recovery is done."""
        return self.core.state

    @property
    def storage_damage(self) -> StorageDamaged | None:
        """See :attr:`EngineCore.storage_damage`."""
        return self.core.storage_damage

    @property
    def writer_failure(self) -> str | None:
        """Why the writer died, if it did."""
        return self.core.writer_failure

    @property
    def _state(self) -> EngineState | None:
        return self.core.current_state

    @property
    def _processor(self) -> TaskProcessor | None:
        return self.core.processor

    def _table(self, name: str) -> Table:
        return self.core.table(name)

    def _writer(self) -> TaskProcessor:
        return self.core.writer()

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
        processor = TaskProcessor(state, urgent_probability=st.urgent_probability, seed=st.seed)
        self.core.serve(state, processor)
        try:
            self.core.recovered_records = await recover(
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
        self.claims.start()
        self.reservations.start()
        self.item_expiry.start()
        self.core.open()
        if self.loop_watchdog is not None:
            self.loop_watchdog.start()
        log.info(
            "engine ready: mode=%s durability=%s tables=%d replayed=%d",
            st.storage_mode,
            st.durability,
            len(state.tables),
            self.core.recovered_records,
        )

    def end_waits(self) -> None:
        """The server stops: every call held waiting for other clients (a claim, a sample of
        an empty or rate-limited table, a reservation, a push the limiter holds, a change
        long-poll) answers 503 ``unavailable`` now, and so does one that would start such a
        wait, rather than keep the stop waiting out its time. Calls that need no such wait
        are still served. ``rlreplay serve`` calls it as its shutdown begins; idempotent.
        """
        state = self.core.current_state
        if state is None or self.core.waits_ended is not None:
            return
        self.core.waits_ended = Unavailable("the server is shutting down; retry once it is back")
        for table in state.tables.values():
            self._end_waits_of(table)

    def _end_waits_of(self, table: Table) -> None:
        assert self.core.waits_ended is not None
        end_waits(table, self.core.waits_ended)

    async def stop(self) -> None:
        """Apply what is queued, checkpoint, close storage; idempotent.

        With the log on, the queue and the final checkpoint get ``stop_timeout_s`` together
        (what they leave is in the log, replayed at the next start), so a stop on a failing
        disk still ends. With ``durability="none"`` the final checkpoint is all there is, and
        it is waited for.
        """
        state, processor = self.core.current_state, self.core.processor
        self.end_waits()
        if not self.core.begin_stop():
            return
        assert state is not None and processor is not None
        if self.loop_watchdog is not None:
            self.loop_watchdog.stop()
        budget = self.settings.stop_timeout_s if state.wal is not None else None
        deadline = None if budget is None else time.monotonic() + budget
        try:
            await self.claims.stop()
            await self.reservations.stop()
            await self.item_expiry.stop()
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
        existing = self.core.state.tables.get(name)
        if existing is not None and not existing.dropping:
            if existing.config == config:
                return False
            raise TableExists(f"table {name!r} exists with another config")
        limit = self.settings.max_tables
        if sum(not t.dropping for t in self.core.state.tables.values()) >= limit:
            raise StorageFull(f"the server holds {limit} tables, its --max-tables: drop one first")
        await self._create(name, config)
        return True

    async def _ensure_table(self, name: str, config: TableConfig) -> None:
        """At start-up: create ``name`` unless recovery brought it back."""
        state = self.core.current_state
        assert state is not None
        existing = state.tables.get(name)
        if existing is None:
            await self._create(name, config)
        elif existing.config != config:
            log.warning(
                "the table %r exists with another config (recovered from the data dir); "
                "keeping it as it is",
                name,
            )

    async def _create(self, name: str, config: TableConfig) -> None:
        try:
            probe = Table(name, 0, config)
        except ValueError as exc:
            raise ValidationFailed(str(exc)) from exc
        for warning in probe.gate.problems(config.max_size, config.max_times_sampled):
            log.warning("table %r: %s", name, warning)
        writer = self.core.writer()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        seq = self.core.admit(records.create_table(name, config.to_wire()))
        writer.submit(CreateTableOp(seq, future=fut, weight=0, name=name, config=config))
        await self.core.committed(seq, fut)
        if self.core.waits_ended is not None:  # created as the server stops
            self._end_waits_of(self.core.table(name))

    async def drop_table(self, name: str) -> None:
        """Delete the table and its data; TableNotFound when missing."""
        await self._drop(self.core.table(name))

    async def _drop(self, table: Table) -> None:
        writer = self.core.writer()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        seq = self.core.admit(records.drop_table(table.name))
        table.mark_dropping()  # until the drop is applied (or refused), calls find no table
        self.claims.forget_table(table)  # its field-learning scan ends here
        self.reservations.forget_table(table)
        writer.submit(DropTableOp(seq, future=fut, weight=0, table=table))
        await self.core.committed(seq, fut)

    # -- snapshots ------------------------------------------------------------------------

    def _snapshots(self) -> Snapshots:
        self.core.writer()  # Unavailable while recovering, stopping, or with the writer dead
        assert self.snapshots is not None
        return self.snapshots

    async def take_snapshot(self, tables: Sequence[str] | None = None) -> SnapshotInfo:
        """Snapshot every table (or ``tables``) to the backup URL; see :class:`Snapshots`."""
        self.core.state  # noqa: B018 - Unavailable until recovery is done
        return await self._snapshots().take(tables)

    async def list_snapshots(self) -> list[SnapshotInfo]:
        """The complete snapshots at the backup URL, newest first."""
        self.core.state  # noqa: B018
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
        return describe(self.core.table(name))

    def tables_summary(self, largest: int | None) -> TablesSummary:
        """Every table's stats summed, and those of the ``largest`` biggest tables (all: None)."""
        s = self.core.state
        return summarize_tables(s.tables.values(), dropped=s.dropped_counters, largest=largest)

    # -- introspection --------------------------------------------------------------------

    def queue_depths(self) -> dict[str, int]:
        """Ops waiting in the writer's queues, and the item ops and bytes they hold."""
        p = self.core.processor
        s = self.core.current_state
        return {
            "urgent": len(p.urgent) if p else 0,
            "housekeeping": len(p.housekeeping) if p else 0,
            "items": s.queued_items if s else 0,
            "bytes": s.queued_bytes if s else 0,
        }

    @property
    def writer_lag_s(self) -> float:
        """Seconds the oldest op not yet applied by the writer has waited."""
        p = self.core.processor
        return p.lag_s if p is not None else 0.0

    @property
    def checkpoint_stats(self) -> CheckpointStats | None:
        """What checkpoints cost and what the start took (None before the writer exists)."""
        p = self.core.processor
        return p.checkpoint_stats if p is not None else None

    def storage_stats(self) -> dict[str, Any]:
        """Engine-wide figures for metrics: cache bytes and limit, log bytes, applied ops."""
        s = self.core.state
        p = self.core.processor
        return {
            "cache_bytes": s.ledger.bytes,
            "cache_limit_bytes": s.ledger.limit_bytes,
            "cache_entries": len(s.ledger),
            "wal_bytes": s.wal.disk_bytes() if s.wal is not None else 0,
            "applied_ops": p.applied_ops if p else 0,
            "recovered_records": self.core.recovered_records,
            "writer_alive": int(self.core.alive),
            "storage_failing": int(
                p is not None
                and (p.storage_failing or (s.wal is not None and s.wal.last_error is not None))
            ),
            "data_lost": dict(s.data_loss.counts),
            "failures": {
                "log_flush": s.wal.flush_failures if s.wal is not None else 0,
                **(p.background_failures if p else {}),
            },
        }

    # -- forwarded to the parts, with their signatures (the routes call the parts) ---------

    async def push(
        self,
        table: str,
        items: Sequence[NewItem],
        *,
        wait: bool = False,
        timeout_s: float | None = None,
        validated: bool = False,
        body: bytes | memoryview | None = None,
        request_id: str | None = None,
        columns: bytes | memoryview | None = None,
    ) -> int:
        """:meth:`Admission.push <rlreplay.app.engine.admission.Admission.push>`."""
        return await self.admission.push(
            table,
            items,
            wait=wait,
            timeout_s=timeout_s,
            validated=validated,
            body=body,
            request_id=request_id,
            columns=columns,
        )

    async def delete(
        self,
        table: str,
        keys: Sequence[str],
        *,
        wait: bool = False,
        request_id: str | None = None,
    ) -> int:
        """:meth:`Admission.delete <rlreplay.app.engine.admission.Admission.delete>`."""
        return await self.admission.delete(table, keys, wait=wait, request_id=request_id)

    async def update_priorities(
        self, table: str, priorities: Mapping[str, float]
    ) -> tuple[int, int]:
        """:meth:`Admission.update_priorities`."""
        return await self.admission.update_priorities(table, priorities)

    async def flush(self) -> None:
        """:meth:`Admission.flush`."""
        await self.admission.flush()

    async def get(self, table: str, key: str) -> Item | None:
        """:meth:`Reads.get <rlreplay.app.engine.reads.Reads.get>`."""
        return await self.reads.get(table, key)

    async def get_many(self, table: str, keys: Sequence[str]) -> list[Item | None]:
        """:meth:`Reads.get_many`."""
        return await self.reads.get_many(table, keys)

    async def get_batch(self, table: str, keys: Sequence[str]) -> ItemBatch:
        """:meth:`Reads.get_batch`."""
        return await self.reads.get_batch(table, keys)

    async def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_s: float | None = None,
        include_values: bool = True,
    ) -> list[SampledItem]:
        """:meth:`Reads.sample <rlreplay.app.engine.reads.Reads.sample>`."""
        return await self.reads.sample(
            table, batch_size, timeout_s=timeout_s, include_values=include_values
        )

    async def sample_batch(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_s: float | None = None,
        include_values: bool = True,
        stacked: bool = False,
        where: list[Condition] | None = None,
    ) -> SampleBatch:
        """:meth:`Reads.sample_batch <rlreplay.app.engine.reads.Reads.sample_batch>`."""
        return await self.reads.sample_batch(
            table,
            batch_size,
            timeout_s=timeout_s,
            include_values=include_values,
            stacked=stacked,
            where=where,
        )

    async def patch(
        self,
        table: str,
        items: Sequence[tuple[str, bytes]],
        *,
        wait: bool = False,
        request_id: str | None = None,
        tags: Sequence[dict[str, Any] | None] | None = None,
    ) -> WriteAnswer:
        """:meth:`Claims.patch <rlreplay.app.engine.claims.Claims.patch>`."""
        return await self.claims.patch(table, items, wait=wait, request_id=request_id, tags=tags)

    async def claim(
        self,
        table: str,
        task: str,
        batch_size: int,
        *,
        fields: list[str] | None = None,
        group_size: int | None = None,
        lease_s: float = 60.0,
        wait_ms: int = 10_000,
        partial: bool = False,
        min_version: int | None = None,
        shape: ClaimShape | None = None,
    ) -> tuple[Lease | None, list[ClaimedItem]]:
        """:meth:`Claims.claim <rlreplay.app.engine.claims.Claims.claim>`."""
        return await self.claims.claim(
            table,
            task,
            batch_size,
            fields=fields,
            group_size=group_size,
            lease_s=lease_s,
            wait_ms=wait_ms,
            partial=partial,
            min_version=min_version,
            shape=shape,
        )

    async def ack(self, table: str, lease_id: str, keys: list[str] | None = None) -> int:
        """:meth:`Claims.ack`."""
        return await self.claims.ack(table, lease_id, keys)

    async def release(self, table: str, lease_id: str, keys: list[str] | None = None) -> int:
        """:meth:`Claims.release`."""
        return await self.claims.release(table, lease_id, keys)

    async def set_version(self, table: str, version: int, *, force: bool = False) -> dict[str, int]:
        """:meth:`Claims.set_version`."""
        return await self.claims.set_version(table, version, force=force)

    def expire_leases(self, *, before: float | None = None) -> None:
        """:meth:`Claims.expire_leases`."""
        self.claims.expire_leases(before=before)

    def tasks(self, table: str) -> dict[str, Any]:
        """:meth:`Claims.tasks`."""
        return self.claims.tasks(table)

    def reservation_stats(self) -> dict[str, dict[str, int]]:
        """:meth:`ReservationDesk.stats`, with the expiry tasks' failures."""
        failures = self.reservations.failures + self.item_expiry.failures
        return {
            name: {**counts, "failures": failures}
            for name, counts in self.reservations.stats().items()
        }

    def task_stats(self) -> dict[str, dict[str, dict[str, int]]]:
        """:meth:`Claims.task_stats`."""
        return self.claims.task_stats()
