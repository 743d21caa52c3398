"""Recovery: the tables come back from the storage (RocksDB or the memory checkpoint; see
:mod:`rlreplay.app.writer.storage`), then the log after the position they cover is replayed on
top.

Whatever is missing or damaged on the way (a checkpoint, a log segment, a record) goes to
the start's :class:`~rlreplay.app.log.data_loss.DataLoss`, which stops the start naming it
unless the settings accept the loss (``--accept-data-loss``, ``--wal-recovery
point-in-time``); a start that went past any then takes a full checkpoint at once, so the
next start does not meet the same damage.

The blocking parts (reading RocksDB, the checkpoint file, the log) run in I/O threads, and
the replay yields to the event loop between records, so a server answers ``/healthz`` while
it recovers. The log is not read into memory: a first pass over its segments checks
every record and counts them (:meth:`~rlreplay.app.log.wal.WriteAheadLog.replay_plan`), then
the records are read back a batch at a time and applied, so a replay holds about one batch
however long the log is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgspec

from rlreplay.app.engine.admission import write_answer
from rlreplay.app.episodes.step_arrays import steps_from_msgpack
from rlreplay.app.log import records
from rlreplay.app.log.data_loss import DataLoss
from rlreplay.app.log.in_use import IN_USE
from rlreplay.app.log.replay import ReplayPlan
from rlreplay.app.log.wal import WriteAheadLog
from rlreplay.app.progress import Progress, RecoveryProgress
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem, PatchedItem, push_body_items
from rlreplay.app.tables.unstacking import msgpack_columns, unstack_values
from rlreplay.app.writer.memory_checkpoint import MEMORY_CHECKPOINT
from rlreplay.app.writer.ops import (
    AckOp,
    CreateTableOp,
    DeleteOp,
    DropTableOp,
    EpisodeAppendOp,
    EpisodeDeleteOp,
    EpisodePriorityOp,
    Op,
    PatchOp,
    PriorityOp,
    PutOp,
    VersionOp,
)
from rlreplay.app.writer.request_ids import scoped_id
from rlreplay.app.writer.state import EngineState
from rlreplay.app.writer.task_processor import TaskProcessor
from rlreplay.wire.schemas import PushRequest
from rlreplay.workers.blocking import BlockingIO

log = logging.getLogger("rlreplay.app.engine.engine")

_REPLAY_YIELD_EVERY = 16  # log records replayed between turns given to the event loop


async def recover(
    state: EngineState,
    processor: TaskProcessor,
    *,
    restored: bool = False,
    progress: RecoveryProgress | None = None,
) -> int:
    """Bring the tables back and replay the log (opening it for new records); returns the
    number of records replayed. Raises :class:`~rlreplay.app.log.framing.LogRecoveryError`
    for a checkpoint or a log that cannot give back everything (see the module's docstring).

    ``restored``: a snapshot was just put in the data dir (memory mode then loads its
    checkpoint file even without the log, which otherwise leaves the file alone).
    ``progress``: where the replay's progress goes (its ``replay`` phase)."""
    st, io = state.settings, state.io
    began = time.monotonic()
    loss = state.data_loss = DataLoss(
        accept=st.accept_data_loss, wal_recovery=st.wal_recovery, checkpoint=_checkpoint_of(st)
    )
    covered = await state.storage.open(state, restored=restored)
    processor.horizon = covered
    if st.durability != "wal":
        processor.note_recovery(time.monotonic() - began, 0, 0.0)
        return 0
    wal = WriteAheadLog(
        st.data_dir / "wal",
        io=io,
        group_commit_s=st.wal_group_commit_ms / 1000,
        writer=st.wal_writer,
        in_use_mark=st.data_dir / IN_USE,
    )
    try:
        replay_began = time.monotonic()
        plan = await io.run(lambda: wal.replay_plan(covered, loss=loss))
        shown = (progress or RecoveryProgress()).start(
            "replay", plan.count, log=log, unit="records"
        )
        await _apply_all(state, processor, plan, loss, shown)
        shown.close()
        replay_s = time.monotonic() - replay_began
        replayed_bytes = await io.run(wal.disk_bytes)  # before the new segment
        await io.run(wal.open, covered)
    except BaseException:
        with contextlib.suppress(OSError):  # its lock goes: the folder can be opened again
            await io.run(wal.close)
        raise
    state.wal = wal
    state.seq = wal.next_lsn - 1
    await processor.trim_all()
    if plan.count or loss.lost:
        # It may take a while (every replayed value is written): say so, or the start looks
        # stuck between "replay: done" and "engine ready".
        log.info("checkpoint after replay: writing what the log held; ready once it is done")
        started = time.monotonic()
        await processor.checkpoint(full=True)
        log.info("checkpoint after replay: done in %.1f s", time.monotonic() - started)
    processor.note_recovery(time.monotonic() - began, replayed_bytes, replay_s)
    return plan.count


async def _apply_all(
    state: EngineState, processor: TaskProcessor, plan: ReplayPlan, loss: DataLoss, shown: Progress
) -> None:
    """Apply the plan's records in order: a batch read in an I/O thread, applied, then the
    next, so the replay holds one batch of records at a time, and the loop gets a turn
    every few records."""
    batches = plan.batches()
    done = 0
    try:
        while (batch := await state.io.run(next, batches, None)) is not None:
            for record in batch:
                try:
                    op = op_from_record(state, record)
                    if op is not None:
                        await processor.apply(op, replay=True)
                        remember_request(state, record)
                except (ValueError, TypeError, KeyError, IndexError) as exc:
                    loss.found("log_record", f"log record {record[0]} cannot be applied: {exc!r}")
                done += 1
                if done % _REPLAY_YIELD_EVERY == 0:
                    shown.advance_to(done)
                    await asyncio.sleep(0)  # let the loop answer probes
            del batch
    finally:
        with contextlib.suppress(ValueError):  # still being read in a cancelled I/O call
            batches.close()
    shown.advance_to(done)


def _checkpoint_of(st: Settings) -> str:
    """The checkpoint a start loads, as messages name it (before it is opened: opening
    RocksDB creates an empty one where there is none)."""
    if st.storage_mode == "memory":
        path = st.data_dir / MEMORY_CHECKPOINT
        return f"the checkpoint {path}" + ("" if path.exists() else ", which is missing,")
    path = st.data_dir / "rocksdb"
    there = (path / "CURRENT").exists()
    return f"the checkpoint in {path}" + ("" if there else ", which is missing,")


async def release(state: EngineState) -> None:
    """After a failed (or cancelled) start: let go of RocksDB and the threads, so the data
    directory can be opened again (by a fixed start, in the same process). A load that a
    cancelled start left running in an I/O thread ends before RocksDB is closed."""
    closer = BlockingIO(threads=1)
    try:
        await closer.run(state.io.close)
        await state.storage.close(closer)
        state.storage.store = None  # closed: the engine's stop() has nothing left to close
    finally:
        closer.close()


_PUSH_REQUEST = msgspec.msgpack.Decoder(PushRequest)


def remember_request(state: EngineState, record: list[Any]) -> None:
    """The idempotency window remembers the request id a replayed write carried."""
    rec = records.read_record(record)
    request: Any = None
    if rec.kind == records.PUT and len(rec.fields) > 4:
        request = rec.fields[4].get("request")
    elif rec.kind == records.DELETE and len(rec.fields) > 1:
        request = rec.fields[1]
    elif rec.kind == records.PATCH:
        request = rec.fields[2]
    elif rec.kind == records.PUSH_COLUMNS:
        request = rec.fields[3].get("request")
    elif rec.kind == records.EPISODE_STEPS:
        request = rec.fields[5]
    elif rec.kind == records.EPISODE_DELETE:
        request = rec.fields[1]
    elif rec.kind == records.PUSH_BODY:
        push = _PUSH_REQUEST.decode(rec.fields[1])
        if push.request_id is not msgspec.UNSET:
            n = len(push.items)
            answer = write_answer(n, push.wait is True)
            state.request_ids.remember(scoped_id("push", push.request_id), answer, rec.fields[0])
        return
    if request is not None:  # [id, kind, answer, time]; the answer says its kind
        rid, _kind, body, at = request
        state.request_ids.remember(rid, dict(body), float(at))


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
        keys, values, prios, ts, *more = fields
        extras = more[0] if more else {}
        nones = [None] * len(keys)
        groups, versions = extras.get("groups") or nones, extras.get("versions") or nones
        tags = extras.get("tags") or nones
        items = [
            NewItem(k, v, p, g, r, tg)
            for k, v, p, g, r, tg in zip(keys, values, prios, groups, versions, tags, strict=True)
        ]
        return PutOp(lsn, table=table, items=items, inserted_at=ts, weight=0)
    if rec.kind == records.PUSH_BODY:
        ts, body = fields
        return PutOp(lsn, table=table, items=push_body_items(body), inserted_at=ts, weight=0)
    if rec.kind == records.PUSH_COLUMNS:  # the values, built from the columns as the API did
        keys, prios, ts, extras, columns = fields
        values = unstack_values(msgpack_columns(columns, len(keys)), len(keys))
        nones = [None] * len(keys)
        groups, versions = extras.get("groups") or nones, extras.get("versions") or nones
        tags = extras.get("tags") or nones
        items = list(map(NewItem, keys, values, prios, groups, versions, tags))
        return PutOp(lsn, table=table, items=items, inserted_at=ts, weight=0)
    if rec.kind == records.DELETE:
        return DeleteOp(lsn, table=table, keys=fields[0], weight=0)
    if rec.kind == records.PATCH:
        keys, values, _, *more = fields
        tags = more[0] if more else [None] * len(keys)
        patched = [PatchedItem(k, v, tags=tg) for k, v, tg in zip(keys, values, tags, strict=True)]
        return PatchOp(lsn, table=table, items=patched, weight=0)
    if rec.kind == records.ACK:
        return AckOp(lsn, table=table, task=fields[0], keys=fields[1], weight=0)
    if rec.kind == records.VERSION:
        return VersionOp(lsn, table=table, version=int(fields[0]), weight=0)
    if rec.kind == records.PRIORITIES:
        return PriorityOp(lsn, table=table, keys=fields[0], priorities=fields[1], weight=0)
    if rec.kind == records.EPISODE_STEPS:
        return _episode_append(lsn, table, fields)
    if rec.kind == records.EPISODE_DELETE:
        return EpisodeDeleteOp(lsn, table=table, episode=fields[0], accepted=False, weight=0)
    if rec.kind == records.EPISODE_PRIORITIES:
        windows = [(str(n), int(s), float(p)) for n, s, p in fields[0]]
        return EpisodePriorityOp(lsn, table=table, windows=windows, weight=0)
    return DropTableOp(lsn, table=table)


def _episode_append(lsn: int, table: Any, fields: tuple[Any, ...]) -> EpisodeAppendOp:
    """The op of an ``episode_steps`` record: its steps read back from the blob."""
    episode, start, k, prios, end, _request, blob = fields
    steps, _dtypes = steps_from_msgpack(blob)
    if table.episodes is not None and k:
        table.episodes.check_steps(steps, _dtypes)  # learns the fields of a first append
    reason, final = (None, None) if end is None else (end[0], end[1])
    final_arrays = steps_from_msgpack(final)[0] if final is not None else None
    return EpisodeAppendOp(
        lsn, table=table, episode=episode, start=int(start), steps=steps, k=int(k),
        priorities=prios, end=reason, final=final_arrays, accepted=False, weight=0,
    )  # fmt: skip
