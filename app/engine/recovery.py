"""Recovery: the tables come back from RocksDB or the memory checkpoint, then the log
after the position they cover is replayed on top.

The blocking parts (reading RocksDB, the checkpoint file, the log) run in I/O threads, and
the replay yields to the event loop between records, so a server answers ``/healthz`` while
it recovers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgpack

from rlreplay.app.log import records
from rlreplay.app.log.wal import LogRecoveryError, WriteAheadLog
from rlreplay.app.storage import layout
from rlreplay.app.storage.rocks import RocksStore
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem, push_body_items
from rlreplay.app.tables.table import Table
from rlreplay.workers.apply import index_fields_of
from rlreplay.workers.memory_checkpoint import MEMORY_CHECKPOINT, read_checkpoint_file
from rlreplay.workers.ops import CreateTableOp, DeleteOp, DropTableOp, Op, PriorityOp, PutOp
from rlreplay.workers.state import EngineState, cache_charge
from rlreplay.workers.task_processor import TaskProcessor

log = logging.getLogger("rlreplay.app.engine.engine")

_REPLAY_YIELD_EVERY = 16  # log records replayed between turns given to the event loop


async def recover(state: EngineState, processor: TaskProcessor) -> int:
    """Bring the tables back and replay the log (opening it for new records); returns the
    number of records replayed. Raises :class:`LogRecoveryError` for a log that cannot be
    replayed whole (unless ``--wal-recovery point-in-time``)."""
    st, io = state.settings, state.io
    covered = 0
    if st.storage_mode != "memory":
        state.store = await io.run(RocksStore, st.data_dir / "rocksdb")
        covered = await load_store(state)
    elif st.durability == "wal" and (st.data_dir / MEMORY_CHECKPOINT).exists():
        covered = await load_memory_checkpoint(state)
    processor.horizon = covered
    if st.durability != "wal":
        return 0
    wal = WriteAheadLog(
        st.data_dir / "wal",
        io=io,
        group_commit_s=st.wal_group_commit_ms / 1000,
        writer=st.wal_writer,
    )
    try:
        strict = st.wal_recovery == "strict"
        records = await io.run(lambda: list(wal.replay(covered, strict=strict)))
        for i, record in enumerate(records):
            try:
                op = op_from_record(state, record)
                if op is not None:
                    await processor.apply(op, replay=True)
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                problem = f"log record {record[0]} cannot be applied: {exc!r}"
                if strict:
                    raise LogRecoveryError(
                        problem + " (--wal-recovery point-in-time skips it)"
                    ) from exc
                log.error("%s: skipped (point-in-time recovery)", problem)
            if i % _REPLAY_YIELD_EVERY == _REPLAY_YIELD_EVERY - 1:
                await asyncio.sleep(0)  # let the loop answer probes
        await io.run(wal.open, covered)
    except BaseException:
        with contextlib.suppress(OSError):  # its lock goes: the folder can be opened again
            await io.run(wal.close)
        raise
    state.wal = wal
    state.seq = wal.next_lsn - 1
    await processor.trim_all()
    if records:
        await processor.checkpoint(full=True)
    return len(records)


async def release(state: EngineState) -> None:
    """After a failed start: let go of RocksDB and the threads, so the data directory can
    be opened again (by a fixed start, in the same process)."""
    if state.store is not None:
        await state.io.run(state.store.close)
    state.io.close()


async def load_store(state: EngineState) -> int:
    """Load the tables RocksDB holds; returns the log position they cover."""
    store = state.store
    assert store is not None

    def load() -> tuple[int, int, list[Table]]:
        """The tables RocksDB holds, their items restored (in an I/O thread: a big
        table takes seconds, and the event loop answers probes meanwhile)."""
        tables = []
        for key, value in store.scan(b"t"):
            table = Table.from_state_dict(key[1:].decode(), msgpack.unpackb(value, raw=False))
            rows = []
            fields: list[dict[str, Any]] = []
            for raw_key, raw_meta in store.scan(b"m" + layout.table_id(table.tid)):
                prio, ts, sampled, size, order, indexed = layout.unpack_meta(raw_meta)
                rows.append((layout.item_key_of(raw_key), None, prio, ts, sampled, size, order))
                if table.index_fields:
                    fields.append(indexed)
            restore_rows(state, table, rows, on_disk=True, fields=fields)
            tables.append(table)
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


async def load_memory_checkpoint(state: EngineState) -> int:
    """Load the tables of the memory-mode checkpoint; returns the log position it covers."""

    def load() -> tuple[dict[str, Any], list[Table]]:
        """The checkpoint's tables, their items restored (in an I/O thread)."""
        header, rows = read_checkpoint_file(state.settings.data_dir / MEMORY_CHECKPOINT)
        by_tid: dict[int, list[tuple[Any, ...]]] = {}
        for tid, key, value, prio, ts, sampled, order in rows:
            by_tid.setdefault(tid, []).append(
                (key, value, prio, ts, sampled, len(value) + len(key), order)
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
            tables.append(table)
        return header, tables

    header, tables = await state.io.run(load)
    for table in tables:
        state.tables[table.name] = table
    state.next_tid = int(header["next_tid"])
    return int(header["lsn"])


def op_from_record(state: EngineState, record: list[Any]) -> Op | None:
    """The op a log record describes (ValueError, KeyError...: it cannot be applied)."""
    rec = records.read_record(record)
    lsn, name, fields = rec.lsn, rec.table, rec.fields
    if rec.kind == records.CREATE_TABLE:
        return CreateTableOp(lsn, name=name, config=TableConfig.model_validate(fields[0]))
    table = state.tables.get(name)
    if table is None:
        raise KeyError(f"its table {name!r} does not exist at that point of the log")
    if rec.kind == records.PUT:
        keys, values, prios, ts = fields
        items = [NewItem(k, v, p) for k, v, p in zip(keys, values, prios, strict=True)]
        return PutOp(lsn, table=table, items=items, inserted_at=ts, weight=0)
    if rec.kind == records.PUSH_BODY:
        ts, body = fields
        return PutOp(lsn, table=table, items=push_body_items(body), inserted_at=ts, weight=0)
    if rec.kind == records.DELETE:
        return DeleteOp(lsn, table=table, keys=fields[0], weight=0)
    if rec.kind == records.PRIORITIES:
        return PriorityOp(lsn, table=table, keys=fields[0], priorities=fields[1], weight=0)
    return DropTableOp(lsn, table=table)


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
