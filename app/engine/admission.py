"""The engine's admission part: writes are checked, admitted (logged, with
``durability="wal"``, and numbered: :meth:`EngineCore.admit
<rlreplay.app.engine.core.EngineCore.admit>`), registered in their table's pending index
and queued for the writer (:class:`rlreplay.app.writer.task_processor.TaskProcessor`). They
return once the log is fsynced, or once applied with ``wait=True``; and a write that
carries a request id is served once.

A write answers ``{"committed": n}`` (applied) or ``{"accepted": n}``
(:data:`WriteAnswer`, of an :class:`~rlreplay.app.writer.request_ids.AnswerKind`); the HTTP
status is the API layer's (:func:`rlreplay.app.api.write_status.status_of`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from rlreplay.app.engine.core import DEFAULT_TIMEOUT_S, EngineCore
from rlreplay.app.log import records
from rlreplay.app.storage.faults import storage_error
from rlreplay.app.tables.items import MAX_KEY_BYTES, NewItem
from rlreplay.app.tables.table import Table
from rlreplay.app.writer.ops import CheckpointOp, PriorityOp, PutOp
from rlreplay.app.writer.request_ids import Answer, answer_count, answer_kind, scoped_id
from rlreplay.app.writer.state import cache_charge
from rlreplay.wire.errors import StorageFull, Unavailable, ValidationFailed

__all__ = ["Admission", "WriteAnswer", "check_key", "fresh_items", "note_answer", "write_answer"]

#: A write's answer: ``{"committed": n}`` once applied, else ``{"accepted": n}`` (a patch
#: adds ``"missing"``); the idempotency window keeps it as it is.
WriteAnswer = Answer


def write_answer(n: int, applied: bool) -> WriteAnswer:
    """The answer of a write of ``n`` items, applied (``wait``) or accepted."""
    return {"committed": n} if applied else {"accepted": n}


def note_answer(request: list[Any], answer: WriteAnswer) -> None:
    """Fill the log's request record ``[id, kind, answer, time]`` with ``answer`` and its
    :class:`~rlreplay.app.writer.request_ids.AnswerKind`'s value."""
    request[1:3] = [answer_kind(answer).value, answer]


class Admission:
    """Writes of items (the ``admission`` part of :class:`~rlreplay.app.engine.engine.Engine`):
    push, delete, priorities, flush; and :meth:`once`, which serves a write that carries a
    request id once (the claims part's patches use it too)."""

    def __init__(self, core: EngineCore) -> None:
        self._core = core

    async def once(
        self,
        kind: str,
        request_id: str | None,
        serve: Callable[[list[Any] | None], Awaitable[WriteAnswer]],
    ) -> WriteAnswer:
        """Serve a write once per request id and ``kind`` of write (push, patch, delete):
        ``serve(request)`` does it, logging ``request`` (``[id, kind, answer, time]``, filled
        in by :func:`note_answer`) with its record; a repeat of the id gets the first answer
        (waiting for it while it is in flight)."""
        if request_id is None:
            return await serve(None)
        request_id = scoped_id(kind, request_id)
        ids = self._core.state.request_ids
        got = ids.begin(request_id)
        if got is None:
            try:
                answer = await serve([request_id, 0, {}, time.time()])
            except BaseException as exc:
                ids.forget(request_id, exc)
                raise
            ids.finish(request_id, answer)
            return answer
        if isinstance(got, dict):
            return got
        return await asyncio.shield(got)

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

        Returns the count of ``items``, those a table with ``max_staleness`` drops at once
        as already stale included (the contract's ``accepted`` counts them), with or
        without a ``request_id``.
        """
        if request_id is None:
            await self._push(table, items, wait, timeout_s, validated, body, None, columns)
            return len(items)
        answer = await self.push_answer(
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
        body: bytes | memoryview | None = None,
        request_id: str | None = None,
        columns: bytes | memoryview | None = None,
        reservation: str | None = None,
    ) -> WriteAnswer:
        """:meth:`push`, answered as the contract says: ``{"committed": n}`` (applied) or
        ``{"accepted": n}``; a repeat of ``request_id`` gets the first answer whatever its
        own ``wait``. The API layer gives it its HTTP status
        (:func:`rlreplay.app.api.write_status.status_of`)."""
        n = len(items)  # the stale items a table drops at once included, as the contract says
        if request_id is None:
            await self._push(
                table, items, wait, timeout_s, validated, body, None, columns, reservation
            )
            return write_answer(n, wait)

        async def serve(request: list[Any] | None) -> WriteAnswer:
            answer = write_answer(n, wait)
            if request is not None:
                note_answer(request, answer)
            await self._push(
                table, items, wait, timeout_s, validated, body, request, columns, reservation
            )
            return answer

        return await self.once("push", request_id, serve)

    async def _push(
        self,
        table: str,
        items: Sequence[NewItem],
        wait: bool,
        timeout_s: float | None,
        validated: bool,
        body: bytes | memoryview | None,
        request: list[Any] | None,
        columns: bytes | memoryview | None = None,
        reservation: str | None = None,
    ) -> int:
        """Admit ``items`` (less those already stale); returns how many were admitted."""
        t = self._core.item_table(table, "push")
        if t.config.max_staleness is not None:
            fresh = fresh_items(t, items)
            if len(fresh) < len(items):  # the log must not bring the stale ones back
                items, body, columns = fresh, None, None
        writer = self._core.writer()
        if not items and request is None:
            return 0
        if validated:
            nbytes = sum([len(it.value) for it in items])
        else:
            nbytes = 0
            for it in items:
                check_key(it.key)
                p = it.priority
                if not (p >= 0 and math.isfinite(p)):
                    raise ValidationFailed(
                        f"priority ({p}) of key {it.key!r} must be a finite float >= 0"
                    )
                nbytes += len(it.value)
        n = len(items)
        self._core.reserve(n, nbytes)
        s = self._core.state
        if request is not None and not n:  # the id alone is logged
            seq = self._core.admit(records.put(table, [], [], [], 0.0, {"request": request}))
            await self._core.committed(seq, None)
            return 0
        if s.storage.capped:
            need = s.ledger.bytes + s.queued_bytes + nbytes + n * cache_charge(0)
            if need > s.ledger.limit_bytes:
                raise StorageFull(
                    f"memory mode: {need} bytes would pass cache_memory_limit_mb "
                    f"({self._core.settings.cache_memory_limit_mb} MB)"
                )
        elif s.ledger.over and self._core.writer().storage_failing:
            if self._core.storage_damage is not None:  # not a state that passes: 500, not 507
                raise storage_error(self._core.storage_damage, str(self._core.settings.data_dir))
            raise StorageFull(
                f"the cache is full and cannot move values to disk in "
                f"{self._core.settings.data_dir}: {self._core.writer().last_background_error}"
            )
        if t.gate.limited:
            await t.gate.acquire_insert(n, DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
            try:
                self._core.reserve(n, nbytes)
                self._core.table(table)
            except BaseException:
                t.gate.refund_insert(n)
                raise
        now = time.time()
        if s.wal is None:
            seq = self._core.admit(None)
        elif body is not None:
            seq = self._core.admit(records.push_body(table, now), body)
        else:
            keys, priorities = [it.key for it in items], [it.priority for it in items]
            extras: dict[str, Any] = {}
            if any(it.group is not None or it.version is not None for it in items):
                extras["groups"] = [it.group for it in items]
                extras["versions"] = [it.version for it in items]
            if any(it.tags is not None for it in items):
                extras["tags"] = [it.tags for it in items]
            if reservation is not None:
                extras["reservation"] = reservation
            if request is not None:
                extras["request"] = request
            # a columnar push's items have no group or version: its columns say it all
            if columns is not None and "groups" not in extras:
                record = records.push_columns(table, keys, priorities, now, extras)
                seq = self._core.admit(record, columns)
            else:
                values = [it.value for it in items]
                seq = self._core.admit(records.put(table, keys, values, priorities, now, extras))
        fut = asyncio.get_running_loop().create_future() if wait else None
        entries = {it.key: (seq, it, now) for it in items}
        t.pending.admit_puts(seq, entries, n)
        writer.submit(
            PutOp(seq, future=fut, weight=n, nbytes=nbytes, table=t, items=items, inserted_at=now)
        )
        try:
            await self._core.committed(seq, fut)
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
        answer = await self.delete_answer(table, keys, wait=wait, request_id=request_id)
        return answer_count(answer)

    async def delete_answer(
        self,
        table: str,
        keys: Sequence[str],
        *,
        wait: bool = False,
        request_id: str | None = None,
    ) -> WriteAnswer:
        """:meth:`delete`, answered as :meth:`push_answer` is."""
        n = len(keys)

        async def serve(request: list[Any] | None) -> WriteAnswer:
            answer = write_answer(n, wait)
            if request is not None:
                note_answer(request, answer)
            t = self._core.table(table)
            writer = self._core.writer()
            if not keys and request is None:
                return answer
            for key in keys:
                check_key(key)
            self._core.reserve(len(keys), 0)
            seq, fut = self._core.enqueue_delete(writer, t, list(keys), wait=wait, request=request)
            await self._core.committed(seq, fut)
            return answer

        return await self.once("delete", request_id, serve)

    async def update_priorities(
        self, table: str, priorities: Mapping[str, float]
    ) -> tuple[int, int]:
        """Set priorities of existing keys, once applied; returns (updated, missing)."""
        t = self._core.table(table)
        writer = self._core.writer()
        keys, values = [], []
        for key, p in priorities.items():
            check_key(key)
            if not (p >= 0 and math.isfinite(p)):
                raise ValidationFailed(f"priority ({p}) of key {key!r} must be a finite float >= 0")
            if t.pending.is_visible(key):
                keys.append(key)
                values.append(float(p))
        missing = len(priorities) - len(keys)
        if not keys:
            return 0, missing
        self._core.reserve(len(keys), 0)
        s = self._core.state
        seq = self._core.admit(
            records.priorities(table, keys, values) if s.wal is not None else None
        )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        t.pending.accept(seq, len(keys))
        writer.submit(
            PriorityOp(seq, future=fut, weight=len(keys), table=t, keys=keys, priorities=values)
        )
        await self._core.committed(seq, fut)
        return len(keys), missing

    async def flush(self) -> None:
        """Checkpoint: what is applied goes to RocksDB (or the memory checkpoint); log truncated."""
        writer = self._core.writer()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        writer.submit(CheckpointOp(0, future=fut, weight=0))
        await fut


def fresh_items(t: Table, items: Sequence[Any]) -> Sequence[Any]:
    """``items`` less those a push brings already stale (dropped, and counted)."""
    floor = t.rollouts.floor()
    if floor is None:
        return items
    kept = [it for it in items if it.version is None or it.version >= floor]
    t.rollouts.dropped_stale += len(items) - len(kept)
    return kept


def check_key(key: str) -> None:
    if (
        not isinstance(key, str)
        or not key
        or (len(key) > MAX_KEY_BYTES // 4 and len(key.encode()) > MAX_KEY_BYTES)
    ):
        raise ValidationFailed(
            f"key must be a string of 1 to {MAX_KEY_BYTES} bytes of UTF-8"
            + (f", got {len(key.encode())} bytes" if isinstance(key, str) and key else "")
        )
