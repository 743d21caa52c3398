"""The single writer: the only code that changes which keys exist, and storage.

Admissions and samples change a table too, in the caller's task, through the methods
:class:`~rlreplay.app.tables.table.Table` names for them.

Callers enqueue ops (see :mod:`rlreplay.app.writer.ops`) on the urgent queue (push, delete,
priorities, tables, checkpoint) or the housekeeping queue (evict, populate) and, if they want,
await the op's future. One owned task drains both: when both have work it takes urgent work with
probability ``urgent_probability`` (0.8 by default) and housekeeping otherwise, so housekeeping is
never starved. If the task dies, every queued op's future and every reader waiting on a
table fail with :class:`~rlreplay.wire.errors.Unavailable` instead of hanging.

With the write-ahead log on, the writer applies an op only once its record is durable: an
op whose log flush failed is refused (its caller answered an error) and is taken out of the
queue and of the pending index, so nothing refused is ever applied. Storage errors in
background work (checkpoints, evictions) are logged, counted and retried with backoff; they
never stop the writer.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from pathlib import Path
from typing import Any, TypeGuard

from rlreplay.app.storage.faults import storage_error
from rlreplay.app.tables.table import Table
from rlreplay.app.writer.apply import OpApplier, raise_into
from rlreplay.app.writer.checkpoints import Checkpointer, CheckpointStats
from rlreplay.app.writer.episodes import rebuild_accepted
from rlreplay.app.writer.ops import (
    AckOp,
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
    queued_ops,
)
from rlreplay.app.writer.state import (
    EngineState,
)
from rlreplay.wire.errors import Unavailable

log = logging.getLogger(__name__)

YIELD_EVERY = 64  # ops applied between yields to the event loop, at most
#: Seconds of applying after which the writer yields to the event loop, however few ops
#: that was (joined pushes of 1,024 items take milliseconds each; 64 of them would hold
#: every route for a good part of a second).
YIELD_AFTER_S = 0.004
JOIN_ITEMS = 1024  # items past which no more queued pushes join one (bounds a step's time)
BETWEEN_STEPS_S = 0.002  # how long the writer applies pushes between a checkpoint's steps


class TaskProcessor:
    """Owns the writer task and its queues, and applies ops in order.

    It holds the two parts that do the work: an :class:`~rlreplay.app.writer.apply.OpApplier`
    (each op's effect on tables and storage) and a
    :class:`~rlreplay.app.writer.checkpoints.Checkpointer` (checkpoints and captures), and
    hands each the calls on its queues that it needs.
    """

    def __init__(
        self, state: EngineState, *, urgent_probability: float, seed: int | None = None
    ) -> None:
        self._state = state
        self._checkpointer = Checkpointer(
            state, oldest_queued_seq=self.oldest_queued_seq, between_steps=self.apply_pushes
        )
        self._applier = OpApplier(
            state, checkpointer=self._checkpointer, submit=self.submit, seed=seed
        )
        self._urgent_probability = urgent_probability
        self._rng = random.Random(seed)
        self.urgent: deque[Op] = deque()
        self.housekeeping: deque[Op] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._idle = False
        self.failure: BaseException | None = None
        self.applied_ops = 0
        self.last_apply_lag_s = 0.0
        self._current: Op | None = None  # the op taken from the queue and not finished
        self._applying = False  # ... and past its log wait: its pending entries are taken

    # -- what the engine asks of its parts ------------------------------------------------

    async def apply(self, op: Op, *, replay: bool = False) -> None:
        """Apply one op to the tables and storage (also used to replay the log)."""
        await self._applier.apply(op, replay=replay)

    async def trim_all(self) -> None:
        """Bring every table within its ``max_size`` (after replaying the log)."""
        await self._applier.trim_all()

    async def checkpoint(self, *, full: bool = False) -> None:
        """Make what is applied durable without the log, then drop the log it covers."""
        await self._checkpointer.checkpoint(full=full)

    async def capture(self, dest: Path) -> dict[str, Any]:
        """Capture every table into the empty folder ``dest`` (see the checkpointer)."""
        return await self._checkpointer.capture(dest)

    @property
    def horizon(self) -> int:
        """The log position the last checkpoint covered (set by the engine on recovery)."""
        return self._checkpointer.horizon

    @horizon.setter
    def horizon(self, lsn: int) -> None:
        self._checkpointer.horizon = lsn

    @property
    def checkpoint_stats(self) -> CheckpointStats:
        """What checkpoints cost and what the start took, for /metrics."""
        return self._checkpointer.stats

    def note_recovery(self, seconds: float, replayed_bytes: int, replay_s: float) -> None:
        """What the start took (see :meth:`Checkpointer.note_recovery`)."""
        self._checkpointer.note_recovery(seconds, replayed_bytes, replay_s)

    @property
    def background_failures(self) -> dict[str, int]:
        """Background failures by kind (checkpoint, evict, store), for /metrics."""
        return self._applier.background_failures

    @property
    def last_background_error(self) -> str | None:
        """The last background write's error, as ``"kind: error"``."""
        return self._applier.last_background_error

    @property
    def storage_failing(self) -> bool:
        """Whether background writes to storage are failing now."""
        return self._applier.storage_failing

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
        """Apply every queued urgent op, then stop the task; idempotent. Past ``timeout_s`` (a
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
            exc = Unavailable("the writer stopped")
        else:
            err = task.exception()
            if err is None:
                return
            log.error("writer failed", exc_info=err)
            self.failure = err
            exc = Unavailable(f"the writer failed: {err!r}")
        self._fail_all(exc)

    def _fail_all(self, exc: Unavailable) -> None:
        for queue in (self.urgent, self.housekeeping):
            while queue:
                op = queue.popleft()
                if op.future is not None and not op.future.done():
                    op.future.set_exception(exc)
        for table in self._state.tables.values():
            table.fail_waiters(exc)

    # -- queueing -------------------------------------------------------------------------

    def submit(self, op: Op, *, housekeeping: bool = False) -> None:
        """Enqueue an op (never blocks; the caller has checked the queue bound)."""
        if self._task is None or self._task.done():
            raise Unavailable("the writer is not running")
        op.queued_at = time.monotonic()
        (self.housekeeping if housekeeping else self.urgent).append(op)
        self._state.queued_items += op.weight
        self._state.queued_bytes += op.nbytes
        self._wake.set()

    @property
    def lag_s(self) -> float:
        """Seconds the oldest queued op has waited (0 when both queues are empty)."""
        waiting = [q[0].queued_at for q in (self.urgent, self.housekeeping) if q]
        return time.monotonic() - min(waiting) if waiting else 0.0

    def oldest_queued_seq(self) -> int | None:
        """Sequence number of the oldest logged op still waiting in the urgent queue."""
        for op in self.urgent:
            if op.seq:
                return op.seq
        return None

    @property
    def idle(self) -> bool:
        """True while the writer waits for work (no op half-applied)."""
        return self._idle

    async def _run(self) -> None:
        since_yield = 0
        yield_at = time.monotonic() + YIELD_AFTER_S
        while True:
            if not self.urgent and not self.housekeeping:
                self._wake.clear()
                self._idle = True
                retry_in = self._applier.retry_in()
                if retry_in is None:
                    await self._wake.wait()
                else:
                    try:
                        await asyncio.wait_for(self._wake.wait(), retry_in)
                    except TimeoutError:
                        pass
                self._idle = False
                since_yield = 0
                yield_at = time.monotonic() + YIELD_AFTER_S
                self._applier.queue_retries()
                if not self.urgent and not self.housekeeping:
                    continue
            s = self._state
            await self._applier.evict_if_far_over()
            if self.urgent and (
                not self.housekeeping or self._rng.random() < self._urgent_probability
            ):
                op = self.urgent.popleft()
            else:
                op = self.housekeeping.popleft()
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
                if type(op) is PutOp:
                    op = self._current = self.join_pushes(op)
                self._applying = True
                await self.apply(op)
            except Exception as exc:
                for part in queued_ops(op):
                    if part.future is not None and not part.future.done():
                        part.future.set_exception(exc)
                raise
            finally:
                self._current = None
                self._applying = False
            for part in queued_ops(op):
                if part.future is not None and not part.future.done():
                    part.future.set_result(None)
            self.applied_ops += len(queued_ops(op))
            if wal is not None and self._checkpointer.due(wal):
                self._applier.queue_checkpoint_when_due()
            self._applier.queue_retries()
            since_yield += 1
            if since_yield >= YIELD_EVERY or time.monotonic() >= yield_at:
                since_yield = 0
                await asyncio.sleep(0)
                yield_at = time.monotonic() + YIELD_AFTER_S

    async def apply_pushes(self) -> None:
        """Between a checkpoint's steps: apply the pushes at the head of the urgent queue
        that are durable already (nothing left to refuse), for up to :data:`BETWEEN_STEPS_S`,
        so ingest goes on while a checkpoint writes. Only pushes: they change no table's
        set, and the checkpoint looks at each slot again when its step comes."""
        wal = self._state.wal
        urgent = self.urgent
        outer = self._current
        deadline = time.monotonic() + BETWEEN_STEPS_S
        while urgent and time.monotonic() < deadline:
            op = urgent[0]
            if type(op) is not PutOp or op.refused:
                return
            if wal is not None and (op.seq > wal.durable_lsn or wal.refusal(op.seq) is not None):
                return
            urgent.popleft()
            self._state.queued_items -= op.weight
            self._state.queued_bytes -= op.nbytes
            op = self._current = self.join_pushes(op)
            try:
                await self.apply(op)
            except Exception as exc:
                for part in queued_ops(op):
                    if part.future is not None and not part.future.done():
                        part.future.set_exception(exc)
                raise
            finally:
                self._current = outer
            for part in queued_ops(op):
                if part.future is not None and not part.future.done():
                    part.future.set_result(None)
            self.applied_ops += len(queued_ops(op))

    def join_pushes(self, op: PutOp) -> PutOp:
        """``op`` and the pushes queued right behind it as one op, when they can be applied
        together: same table, keys all distinct, durable already (nothing left to refuse).

        Under load pushes queue up faster than the writer applies them one by one, and much
        of a push's cost is per op (NumPy calls, the remover's trim): joined, they pay it
        once. The result is what applying them in turn gives: their keys are distinct, each
        item keeps its own push's sequence number and time, and a change feed gets a batch
        per push.
        """
        urgent = self.urgent
        if not urgent or not self._joins(urgent[0], op):  # a miss builds no set of keys
            return op
        seen = {it.key for it in op.items}
        if len(seen) != len(op.items):
            return op
        parts, items = [op], len(op.items)
        while urgent and items < JOIN_ITEMS and self._joins(nxt := urgent[0], op):
            before = len(seen)
            seen.update(it.key for it in nxt.items)
            if len(seen) != before + len(nxt.items):
                break
            urgent.popleft()
            self._state.queued_items -= nxt.weight
            self._state.queued_bytes -= nxt.nbytes
            parts.append(nxt)
            items += len(nxt.items)
        if len(parts) == 1:
            return op
        last = parts[-1]
        return PutOp(
            last.seq,
            weight=sum(part.weight for part in parts),
            nbytes=sum(part.nbytes for part in parts),
            table=op.table,
            items=[it for part in parts for it in part.items],
            inserted_at=last.inserted_at,
            parts=tuple(parts),
        )

    def _joins(self, queued: Op, op: PutOp) -> TypeGuard[PutOp]:
        """Whether ``queued`` is a push that may join ``op`` (keys aside): same table, not
        refused, and durable already, so that no failed flush can refuse it later."""
        if type(queued) is not PutOp or queued.table is not op.table or queued.refused:
            return False
        wal = self._state.wal
        return wal is None or (queued.seq <= wal.durable_lsn and wal.refusal(queued.seq) is None)

    # -- failures -------------------------------------------------------------------------

    def drop_refused(self) -> None:
        """Take the ops whose log record a failed flush lost out of the queue, fail their
        callers, and recompute the pending index of their tables without them; idempotent
        (the caller that saw the failure and the writer both call it)."""
        s = self._state
        wal = s.wal
        if wal is None:
            return
        refused: list[Op] = []
        kept: deque[Op] = deque()
        for op in self.urgent:
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
        self.urgent.clear()
        self.urgent.extend(kept)
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
                op.table.mark_dropping(False)
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
            if t.episodes is not None:  # what appends are numbered against, without the refused
                unapplied = (
                    [current]
                    if current is not None and not current.refused and not self._applying
                    else []
                )
                rebuild_accepted(t, [*unapplied, *kept])


def _item_op_of(op: Op, table: Table) -> bool:
    """Whether ``op`` is one of ``table``'s ops that its pending index counts (item ops,
    and an episode table's appends, deletes and window priorities)."""
    return isinstance(
        op,
        PutOp
        | DeleteOp
        | PriorityOp
        | PatchOp
        | AckOp
        | VersionOp
        | EpisodeAppendOp
        | EpisodeDeleteOp
        | EpisodePriorityOp,
    ) and (op.table is table)
