"""What every part of the engine shares: the state it serves, the writer, the checks each
call makes, the log append that admits a write, waiting for the log (and the writer), and
the cap on answers.

:class:`EngineCore` is one object held by every part of
:class:`~rlreplay.app.engine.engine.Engine` (admission, reads, claims), each of which takes it
in its constructor; no part inherits from it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np

from rlreplay.app.log import records
from rlreplay.app.progress import RecoveryProgress
from rlreplay.app.settings import Settings
from rlreplay.app.storage.faults import StorageDamaged, storage_error
from rlreplay.app.tables.table import Table
from rlreplay.app.writer.ops import DeleteOp
from rlreplay.app.writer.state import EngineState
from rlreplay.app.writer.task_processor import TaskProcessor
from rlreplay.wire.errors import (
    Overloaded,
    TableNotFound,
    Unavailable,
    ValidationFailed,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0

#: The routes that apply to an episode table, named when an item route refuses one.
EPISODE_ROUTES = (
    "POST /v1/tables/{table}/episodes/{episode}/steps, "
    "GET and DELETE /v1/tables/{table}/episodes/{episode}, "
    "POST /v1/tables/{table}/sample and POST /v1/tables/{table}/priorities"
)


class EngineCore:
    """The engine's state and the checks every call makes; the parts of
    :class:`~rlreplay.app.engine.engine.Engine` hold it (``start`` fills it in)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._state: EngineState | None = None
        self._processor: TaskProcessor | None = None
        self.rng = np.random.default_rng(settings.seed)
        self._ready = False
        self._open = False  # recovery finished: table and item calls are served
        self._stopping = False
        #: Set by ``Engine.end_waits`` as the server stops: what held waits raise.
        self.waits_ended: Unavailable | None = None
        self.recovered_records = 0
        #: How far the start-up's restore and log replay are (``/metrics``).
        self.recovery = RecoveryProgress()

    def serve(self, state: EngineState, processor: TaskProcessor) -> None:
        """Recovery built ``state`` and ``processor``: calls reach them from now on (table
        and item calls once :meth:`open`)."""
        self._state, self._processor = state, processor

    def open(self) -> None:
        """Recovery finished: table and item calls are served."""
        self._open = self._ready = True

    def begin_stop(self) -> bool:
        """Refuse new writes from now on; False when stopping already (or never started)."""
        if self._stopping or self._state is None:
            return False
        self._stopping = True
        self._ready = False
        return True

    @property
    def is_open(self) -> bool:
        """True once recovery finished."""
        return self._open

    @property
    def current_state(self) -> EngineState | None:
        """The state, None before ``start`` (no check made)."""
        return self._state

    @property
    def processor(self) -> TaskProcessor | None:
        """The writer, None before ``start`` (no check made)."""
        return self._processor

    @property
    def ready(self) -> bool:
        """True once recovery finished and the writer runs."""
        return self._ready and self._processor is not None and self._processor.running

    @property
    def state(self) -> EngineState:
        if self._state is None:
            raise Unavailable("the engine is not started")
        if not self._open:
            raise Unavailable("not ready: recovering the tables from the data directory")
        return self._state

    def writer(self) -> TaskProcessor:
        p = self._processor
        if p is None or not p.running or self._stopping:
            reason = "shutting down" if self._stopping else "the writer is not running"
            if p is not None and p.failure is not None:
                reason = f"the writer failed: {p.failure!r}"
            raise Unavailable(reason)
        return p

    def table(self, name: str) -> Table:
        table = self.state.tables.get(name)
        if table is None or table.dropping:
            raise TableNotFound(f"no table {name!r}")
        return table

    def item_table(self, name: str, route: str) -> Table:
        """The table ``name`` for an item ``route``; ValidationFailed, naming the routes
        that apply, when it is an episode table."""
        table = self.table(name)
        if table.episodes is not None:
            raise ValidationFailed(
                f"table {name!r} is an episode table: {route} does not apply to it; use "
                + EPISODE_ROUTES
            )
        return table

    @property
    def alive(self) -> bool:
        """False once the writer has died (an orchestrator should restart the process);
        True while recovering, serving or stopping."""
        p = self._processor
        return p is None or p.failure is None

    @property
    def storage_damage(self) -> StorageDamaged | None:
        """The damage RocksDB found in its files while serving (reads, flushes,
        compactions), which no retry mends: the process should be restarted, and its start
        refuses the damaged file by name. None while none was found (and in memory mode)."""
        store = None if self._state is None else self._state.store
        return None if store is None else store.damage

    @property
    def writer_failure(self) -> str | None:
        """Why the writer died, if it did."""
        p = self._processor
        return None if p is None or p.failure is None else repr(p.failure)

    def reserve(self, n: int, nbytes: int) -> None:
        s = self.state
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

    async def committed(self, seq: int, fut: asyncio.Future[None] | None) -> None:
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

    @property
    def max_answer_bytes(self) -> int:
        return int(self.settings.max_response_mb * 2**20)

    def too_big(self, nbytes: int, what: str) -> ValidationFailed:
        return ValidationFailed(
            f"{what} would answer {nbytes / 2**20:.1f} MB of keys and values, past the "
            f"server's --max-response-mb ({self.settings.max_response_mb:g}); ask for fewer"
        )

    def admit(self, record: list[object] | None, blob: bytes | memoryview | None = None) -> int:
        """Admit a write: append ``record`` (then ``blob``, as one more bin element) to the
        log when it is on, and give the write its sequence number (the log's LSN then).
        Every write the engine accepts passes here, once its checks are made and before it
        is queued for the writer (the tables ``start`` creates or drops too: no open check)."""
        s = self._state
        assert s is not None
        wal = s.wal
        if wal is None or record is None:
            s.seq += 1
            return s.seq
        try:
            s.seq = wal.append(record, blob)
        except (OverflowError, ValueError, TypeError) as exc:  # nothing was logged
            raise ValidationFailed(f"the request cannot be logged: {exc}") from exc
        return s.seq

    def enqueue_delete(
        self,
        writer: TaskProcessor,
        t: Table,
        keys: list[str],
        *,
        wait: bool,
        request: list[Any] | None = None,
    ) -> tuple[int, asyncio.Future[None] | None]:
        s = self.state
        seq = self.admit(records.delete(t.name, keys, request) if s.wal is not None else None)
        fut = asyncio.get_running_loop().create_future() if wait else None
        t.pending.admit_deletes(seq, keys)
        writer.submit(DeleteOp(seq, future=fut, weight=len(keys), table=t, keys=keys))
        if t.gate.limited:
            t.gate.notify()  # the visible size changed: limiter waiters look again
        return seq, fut
