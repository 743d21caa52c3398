"""The engine's episodes part: appends to, deletes and reads of the episodes of episode
tables, and window priorities.

An append is checked (fields, priorities, its ``start`` against the episode's length once
every accepted op is applied), logged (an ``episode_steps`` record: :meth:`EngineCore.admit
<rlreplay.app.engine.core.EngineCore.admit>`), counted in the table's accepted ops and
queued for the writer, like a push; it returns once the log is fsynced, or applied with
``wait``. An append whose ``start`` is before the episode's length is a retry when the steps
it sends are stored with the same bytes (answered as accepted, nothing changes), else 409
``step_conflict``. Reads wait for the table's accepted ops to be applied, so they see every
append answered before them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.app.engine.admission import Admission, WriteAnswer, note_answer, write_answer
from rlreplay.app.engine.core import DEFAULT_TIMEOUT_S, EngineCore
from rlreplay.app.episodes.chunk_fetch import read_back
from rlreplay.app.episodes.episode_table import EpisodeTable
from rlreplay.app.episodes.step_arrays import pack_steps
from rlreplay.app.log import records
from rlreplay.app.tables.items import MAX_KEY_BYTES
from rlreplay.app.tables.table import Table
from rlreplay.app.writer.ops import EpisodeAppendOp, EpisodeDeleteOp, EpisodePriorityOp
from rlreplay.app.writer.state import cache_charge
from rlreplay.wire.errors import (
    ItemNotFound,
    StepConflict,
    StorageFull,
    Unavailable,
    ValidationFailed,
)

__all__ = ["EpisodeRead", "Episodes", "check_episode_name", "episode_table_of"]


def check_episode_name(name: Any) -> str:
    """An episode's name: 1 to 512 bytes of UTF-8 (ValidationFailed otherwise)."""
    if (
        not isinstance(name, str)
        or not name
        or len(name.encode("utf-8", "replace")) > MAX_KEY_BYTES
    ):
        raise ValidationFailed(f"episode name must be 1 to {MAX_KEY_BYTES} bytes of UTF-8")
    try:
        name.encode()
    except UnicodeEncodeError as exc:
        raise ValidationFailed("episode name must be valid UTF-8") from exc
    return name


def episode_table_of(t: Table) -> EpisodeTable:
    """``t``'s episodes; ValidationFailed for a table of items."""
    if t.episodes is None:
        raise ValidationFailed(
            f'table {t.name!r} holds items, not episodes: create it with an "episodes" '
            "config to append steps"
        )
    return t.episodes


class EpisodeRead:
    """An episode's steps ``[start, stop)`` as read: ``{"episode", "length", "end",
    "steps", "final"?}`` with arrays, and the wire dtypes of the fields (bfloat16)."""

    __slots__ = ("dtypes", "end", "episode", "final", "length", "start", "steps")

    def __init__(
        self,
        episode: str,
        length: int,
        end: str | None,
        start: int,
        steps: dict[str, np.ndarray],
        final: dict[str, np.ndarray] | None,
        dtypes: dict[str, str],
    ) -> None:
        self.episode, self.length, self.end, self.start = episode, length, end, start
        self.steps, self.final, self.dtypes = steps, final, dtypes


class Episodes:
    """Appends, deletes and reads of episodes (the ``episodes`` part of
    :class:`~rlreplay.app.engine.engine.Engine`); writes that carry a request id are
    served once through the admission part."""

    def __init__(self, core: EngineCore, admission: Admission) -> None:
        self._core = core
        self._admission = admission

    async def append(
        self,
        table: str,
        episode: str,
        *,
        start: int,
        steps: Mapping[str, np.ndarray],
        dtypes: Mapping[str, str] | None = None,
        priorities: Sequence[float] | None = None,
        end: str | None = None,
        final: Mapping[str, Any] | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
        request_id: str | None = None,
        blob: bytes | memoryview | None = None,
    ) -> WriteAnswer:
        """Append steps to an episode; ``{"accepted": k}`` (``{"committed": k}`` with
        ``wait``). ``blob``: the msgpack ``steps`` map as sent, which the log keeps instead
        of packing the arrays again.

        Raises:
            ValidationFailed: A bad name, fields, priorities or end, or a table of items.
            StepConflict: ``start`` is not the episode's length and no retry, or it ended.
        """
        t = self._core.table(table)
        e = episode_table_of(t)
        check_episode_name(episode)
        dtypes = dict(dtypes or {})
        if not isinstance(start, int) or start < 0:
            raise ValidationFailed(f"start ({start}) must be an int >= 0")
        if end is not None and end not in ("terminated", "truncated"):
            raise ValidationFailed(f"end.reason ({end!r}) must be 'terminated' or 'truncated'")
        k = e.check_steps(steps, dtypes)
        prios: list[float] | None = None
        if priorities is not None:
            prios = [float(p) for p in priorities]
            if len(prios) != k:
                raise ValidationFailed(f"priorities holds {len(prios)} values for {k} steps")
            for i, p in enumerate(prios):
                if not (p >= 0 and math.isfinite(p)):
                    raise ValidationFailed(f"priorities[{i}] ({p}) must be a finite float >= 0")
        if final and end is None:
            raise ValidationFailed("final values come with an end")
        final_arrays = e.check_final(final or {}) if end is not None else {}

        async def serve(request: list[Any] | None) -> WriteAnswer:
            answer = write_answer(k, wait)
            if request is not None:
                note_answer(request, answer)
            await self._append(
                t, e, episode, start, steps, dtypes, k, prios, end, final_arrays, wait,
                timeout_s, request, blob,
            )  # fmt: skip
            return answer

        return await self._admission.once("episode", request_id, serve)

    async def _append(
        self,
        t: Table,
        e: EpisodeTable,
        episode: str,
        start: int,
        steps: Mapping[str, np.ndarray],
        dtypes: dict[str, str],
        k: int,
        prios: list[float] | None,
        end: str | None,
        final: dict[str, np.ndarray],
        wait: bool,
        timeout_s: float | None,
        request: list[Any] | None,
        blob: bytes | memoryview | None,
    ) -> None:
        core = self._core
        writer = core.writer()
        length, ended = e.accepted.view(episode)
        if start != length or ended:
            if e.accepted.admit_append(
                episode, start, k, end
            ):  # pragma: no cover - start == length
                raise AssertionError("admitted an append at the wrong start")
            await t.pending.caught_up()  # the steps it may repeat are applied
            if not e.is_retry(episode, start, steps, k, end):
                length, ended = e.accepted.view(episode)
                state = "has ended" if ended else "is open"
                raise StepConflict(
                    f"episode {episode!r} holds {length} steps and {state}: the append at "
                    f"{start} differs from the steps stored there"
                )
            return  # a retry of stored steps: nothing changes
        nbytes = sum(int(a.nbytes) for a in steps.values())
        core.reserve(k, nbytes)
        s = core.state
        if s.storage.capped:  # the ledger counts held chunks and tails too
            need = s.ledger.bytes + s.queued_bytes + nbytes + cache_charge(0)
            if need > s.ledger.limit_bytes:
                raise StorageFull(
                    f"memory mode: {need} bytes would pass cache_memory_limit_mb "
                    f"({core.settings.cache_memory_limit_mb} MB)"
                )
        if t.gate.limited and k:
            await t.gate.acquire_insert(k, DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
        try:
            core.table(t.name)
            if not e.accepted.admit_append(episode, start, k, end):  # another append came first
                length, _ = e.accepted.view(episode)
                raise StepConflict(
                    f"episode {episode!r} holds {length} steps: an append must start at "
                    f"{length}, not {start}"
                )
        except BaseException:
            if t.gate.limited and k:
                t.gate.refund_insert(k)
            raise
        seq = self._log_append(
            t, episode, start, steps, dtypes, k, prios, end, final, request, blob
        )
        fut = asyncio.get_running_loop().create_future() if wait else None
        t.pending.accept(seq, k)
        writer.submit(
            EpisodeAppendOp(
                seq, future=fut, weight=k, nbytes=nbytes, table=t, episode=episode, start=start,
                steps=dict(steps), k=k, priorities=prios, end=end, final=final or None,
            )
        )  # fmt: skip
        try:
            await core.committed(seq, fut)
        except (StorageFull, Unavailable):
            if t.gate.limited and k and s.wal is not None and s.wal.refusal(seq) is not None:
                t.gate.refund_insert(k)
            raise

    def _log_append(
        self,
        t: Table,
        episode: str,
        start: int,
        steps: Mapping[str, np.ndarray],
        dtypes: dict[str, str],
        k: int,
        prios: list[float] | None,
        end: str | None,
        final: dict[str, np.ndarray],
        request: list[Any] | None,
        blob: bytes | memoryview | None,
    ) -> int:
        """Admit the append: its log record (when the log is on) and its number."""
        core = self._core
        if core.state.wal is None:
            return core.admit(None)
        ended = None if end is None else [end, pack_steps(final, dtypes) if final else None]
        record = records.episode_steps(t.name, episode, start, k, prios, ended, request)
        return core.admit(record, blob if blob is not None else pack_steps(steps, dtypes))

    async def delete(
        self, table: str, episode: str, *, wait: bool = False, request_id: str | None = None
    ) -> WriteAnswer:
        """Delete an episode (a missing one is no change): ``{"accepted": 1}``."""
        t = self._core.table(table)
        e = episode_table_of(t)
        check_episode_name(episode)

        async def serve(request: list[Any] | None) -> WriteAnswer:
            answer = write_answer(1, wait)
            if request is not None:
                note_answer(request, answer)
            core = self._core
            writer = core.writer()
            core.reserve(1, 0)
            record = records.episode_delete(t.name, episode, request)
            seq = core.admit(record if core.state.wal is not None else None)
            e.accepted.admit_delete(episode)
            fut = asyncio.get_running_loop().create_future() if wait else None
            t.pending.accept(seq, 1)
            writer.submit(EpisodeDeleteOp(seq, future=fut, weight=1, table=t, episode=episode))
            await core.committed(seq, fut)
            return answer

        return await self._admission.once("episode_delete", request_id, serve)

    async def set_window_priorities(
        self, table: str, windows: Sequence[tuple[str, int, float]]
    ) -> tuple[int, int]:
        """Set the priority of each window ``(episode, start, priority)``, once applied;
        returns (updated, missing): windows whose start is not held are skipped."""
        t = self._core.table(table)
        e = episode_table_of(t)
        writer = self._core.writer()
        for name, start, p in windows:
            check_episode_name(name)
            if not (p >= 0 and math.isfinite(p)):
                raise ValidationFailed(f"priority ({p}) of window {name!r}@{start} must be >= 0")
        await t.pending.caught_up()
        held = [(n, int(s), float(p)) for n, s, p in windows if e.slot_of(n, int(s)) is not None]
        missing = len(windows) - len(held)
        if not held:
            return 0, missing
        core = self._core
        core.reserve(len(held), 0)
        record = records.episode_priorities(t.name, [list(w) for w in held])
        seq = core.admit(record if core.state.wal is not None else None)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        t.pending.accept(seq, len(held))
        writer.submit(EpisodePriorityOp(seq, future=fut, weight=len(held), table=t, windows=held))
        await core.committed(seq, fut)
        return len(held), missing

    async def read(
        self,
        table: str,
        episode: str,
        start: int | None = None,
        stop: int | None = None,
        *,
        timeout_s: float | None = None,
    ) -> EpisodeRead:
        """Steps ``[start, stop)`` of an episode (clamped to its steps; all by default),
        once every op accepted before the call is applied.

        Raises:
            ItemNotFound: No such episode.
            ValidationFailed: A negative bound, or a table of items.
        """
        t = self._core.table(table)
        e = episode_table_of(t)
        check_episode_name(episode)
        for bound, name in ((start, "start"), (stop, "stop")):
            if bound is not None and bound < 0:
                raise ValidationFailed(f"{name} ({bound}) must be >= 0")
        await t.pending.caught_up(DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
        ep = e.episode(episode)
        if ep is None:
            raise ItemNotFound(f"no episode {episode!r} in table {table!r}")
        lo = min(start or 0, ep.length)
        hi = ep.length if stop is None else max(lo, min(stop, ep.length))
        # chunks evicted to RocksDB: read back off the loop first
        fetched = await read_back(e, lambda: [(episode, lo, hi)], None, self._core.state.io.run)
        if fetched is not None:
            if e.episode(episode) is not ep:
                raise ItemNotFound(f"no episode {episode!r} in table {table!r}")
        steps = {f: np.array(a) for f, a in e.read(episode, lo, hi, fetched=fetched).items()}
        nbytes = sum(a.nbytes for a in steps.values())
        if nbytes > self._core.max_answer_bytes:
            raise self._core.too_big(nbytes, f"steps [{lo}, {hi}) of episode {episode!r}")
        dtypes = {f: spec.dtype for f, spec in (e.specs or {}).items()}
        final = dict(ep.final) if ep.final is not None else None
        return EpisodeRead(episode, ep.length, ep.end, lo, steps, final, dtypes)
