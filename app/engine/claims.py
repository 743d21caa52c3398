"""The engine's claims part: rollout-table calls (patches, claims under leases,
acknowledgements, releases, policy versions).

Claims decide from the table's in-memory rollout index
(:class:`~rlreplay.app.tables.rollouts.Rollouts`) once every op accepted before them is
applied, as samples do, and wait on its signal (never polling) for items to become ready.
Patches, acknowledgements and versions are logged and applied by the writer like pushes;
leases live in memory and :class:`~rlreplay.app.engine.lease_expiry.LeaseExpiry` releases them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlreplay.app.engine.admission import Admission, WriteAnswer, note_answer, write_answer
from rlreplay.app.engine.claim_shape import ClaimShape, lengths_of
from rlreplay.app.engine.core import DEFAULT_TIMEOUT_S, EngineCore
from rlreplay.app.engine.field_learning import FieldLearning
from rlreplay.app.engine.lease_expiry import LeaseExpiry
from rlreplay.app.engine.reads import Reads
from rlreplay.app.log import records
from rlreplay.app.storage.layout import value_key
from rlreplay.app.tables.items import PatchedItem
from rlreplay.app.tables.rollouts import NO_VERSION, Lease, merge_fields, project
from rlreplay.app.tables.table import Table
from rlreplay.app.tables.tag_index import merge_tags
from rlreplay.app.tables.token_budget import balance_ranks, field_length, fit_budget, value_lengths
from rlreplay.app.writer.ops import AckOp, PatchOp, VersionOp
from rlreplay.wire.errors import (
    DeadlineExceeded,
    LeaseNotFound,
    StorageFull,
    ValidationFailed,
    VersionConflict,
)

__all__ = ["ClaimedItem", "Claims"]

#: Tries a patch makes to merge over values read from disk while writes move them.
_PATCH_TRIES = 8
#: The largest step of a policy version without ``force``: no training run makes it (one
#: version per optimizer step), while a mistaken one (2^63 - 1) drops every rollout for good.
MAX_VERSION_STEP = 1_000_000


@dataclass(slots=True)
class ClaimedItem:
    """One item of a claim: ``value`` holds only the fields asked for (msgpack bytes)."""

    key: str
    value: bytes | None  # None with ``values: false``
    priority: float
    group: str | None
    version: int | None
    tags: dict[str, Any] | None = None
    #: With ``values: false``: each returned field's length.
    lengths: dict[str, int] | None = None


class Claims:
    """Rollout calls (the ``claims`` part of :class:`~rlreplay.app.engine.engine.Engine`):
    patches, claims, acknowledgements, releases and policy versions.

    It owns its background work: the lease expiry task (:class:`LeaseExpiry`, from
    :meth:`start` to :meth:`stop`) and each table's field-learning scan, which
    :meth:`forget_table` cancels when the table is dropped and :meth:`stop` when the engine
    stops.
    """

    def __init__(self, core: EngineCore, reads: Reads, admission: Admission) -> None:
        self._core = core
        self._reads = reads
        self._admission = admission
        self._leases = LeaseExpiry()
        self._learning = FieldLearning(core)

    # -- lifetime -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the lease expiry task."""
        self._leases.start()

    async def stop(self) -> None:
        """Stop the lease expiry task and cancel every field-learning scan; idempotent."""
        await self._leases.stop()
        await self._learning.stop()

    def forget_table(self, t: Table) -> None:
        """``t`` is being dropped: its field-learning scan (if one runs) is cancelled."""
        learning = t.rollouts.learning
        if learning is not None and not learning.done():
            learning.cancel()

    # -- patches --------------------------------------------------------------------------

    async def patch(
        self,
        table: str,
        items: Sequence[tuple[str, bytes]],
        *,
        wait: bool = False,
        request_id: str | None = None,
        tags: Sequence[dict[str, Any] | None] | None = None,
    ) -> WriteAnswer:
        """Set fields of existing items' values: ``items`` are (key, msgpack map of the
        fields); ``tags`` (per item, None where none) are merged into their tags.
        Answers ``{"accepted" or "committed": n, "missing": m}``."""

        async def serve(request: list[Any] | None) -> WriteAnswer:
            return await self._patch(table, items, wait=wait, request=request, tags=tags)

        return await self._admission.once("patch", request_id, serve)

    async def _patch(
        self,
        table: str,
        items: Sequence[tuple[str, bytes]],
        *,
        wait: bool,
        request: list[Any] | None,
        tags: Sequence[dict[str, Any] | None] | None = None,
    ) -> WriteAnswer:
        t = self._core.item_table(table, "items:patch")
        writer = self._core.writer()
        read: dict[tuple[int, int], bytes] = {}  # (slot, value version) → value from disk
        for _ in range(_PATCH_TRIES):
            merged, misses = self._merge(t, items, read, tags)
            if not misses:
                break
            s = self._core.state
            assert s.store is not None
            found = await s.io.run(s.store.get_many, [value_key(t.prefix, k) for _, _, k in misses])
            for (slot, version, _), value in zip(misses, found, strict=True):
                if value is not None:
                    read[(slot, version)] = value
            t = self._core.table(table)
        else:
            raise DeadlineExceeded(f"table {table!r}: the items kept moving; retry the patch")
        n = len(merged)
        missing = len(items) - n
        answer = write_answer(n, wait)
        answer["missing"] = missing
        if request is not None:
            note_answer(request, answer)
        if not merged and request is None:
            return answer
        nbytes = sum(len(it.value) for it, _ in merged)
        self._core.reserve(n, nbytes)
        s = self._core.state
        if s.storage.capped and s.ledger.bytes + s.queued_bytes + nbytes > s.ledger.limit_bytes:
            raise StorageFull(
                f"memory mode: the patched values would pass cache_memory_limit_mb "
                f"({self._core.settings.cache_memory_limit_mb} MB)"
            )
        keys = [it.key for it, _ in merged]
        values = [it.value for it, _ in merged]
        logged_tags = [it.tags for it, _ in merged] if tags is not None else None
        seq = self._core.admit(
            records.patch(table, keys, values, request, logged_tags) if s.wal is not None else None
        )
        fut = asyncio.get_running_loop().create_future() if wait and merged else None
        if merged:
            t.pending.admit_patches(seq, {it.key: (seq, it, ts) for it, ts in merged}, n)
            patched = [it for it, _ in merged]
            writer.submit(PatchOp(seq, future=fut, weight=n, table=t, items=patched))
        await self._core.committed(seq, fut)
        return answer

    def _merge(
        self,
        t: Table,
        items: Sequence[tuple[str, bytes]],
        read: dict[tuple[int, int], bytes],
        tags: Sequence[dict[str, Any] | None] | None = None,
    ) -> tuple[list[tuple[PatchedItem, float]], list[tuple[int, int, str]]]:
        """The patched items over what readers see now, or the values to read first."""
        merged: dict[str, tuple[PatchedItem, float]] = {}
        misses: list[tuple[int, int, str]] = []
        pending, index = t.pending.entries, t.index
        for i, (key, fields) in enumerate(items):
            new_tags = None if tags is None else tags[i]
            base = merged.get(key)
            if base is not None:  # the same key twice: the second merges over the first
                it = base[0]
                value = merge_fields(it.value, fields, key)
                merged[key] = (
                    PatchedItem(
                        key, value, it.priority, it.group, it.version, merge_tags(it.tags, new_tags)
                    ),
                    base[1],
                )
                continue
            entry = pending.get(key)
            if entry is not None:
                if entry[1] is None:
                    continue  # deleted
                old, ts = entry[1], entry[2]
                value = merge_fields(old.value, fields, key)
                new = merge_tags(old.tags, new_tags)
                merged[key] = (
                    PatchedItem(key, value, old.priority, old.group, old.version, new),
                    ts,
                )
                continue
            slot = index.get(key)
            if slot is None:
                continue
            current = t.values[slot]
            if current is None:
                current = read.get((slot, int(t.version[slot])))
                if current is None:
                    misses.append((slot, int(t.version[slot]), key))
                    continue
            version = int(t.policy_version[slot])
            merged[key] = (
                PatchedItem(
                    key,
                    merge_fields(current, fields, key),
                    float(t.priority[slot]),
                    t.rollouts.groups.get(slot),
                    None if version == NO_VERSION else version,
                    merge_tags(t.rollouts.tag_index.get(slot), new_tags),
                ),
                float(t.inserted_at[slot]),
            )
        return list(merged.values()), misses

    # -- claims ---------------------------------------------------------------------------

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
        """Hand ``task`` the oldest items ready for it under a new lease (see the
        contract's ``claim``); None and no items when nothing is handed out. ``shape``:
        the ``where`` filter, ``select``, ``values``, token budget and ranks; with
        ``world_size`` the lease's ``ranks`` split the items."""
        shape = shape or ClaimShape()
        if group_size is not None and batch_size % group_size:
            raise ValidationFailed(
                f"batch_size ({batch_size}) must be a multiple of group_size ({group_size})"
            )
        t = self._core.item_table(table, "claim")
        timeout = wait_ms / 1000
        deadline = time.monotonic() + timeout
        # what was answered before the claim is applied first, however short its wait: a
        # claim reads its writes (the writer's lag is short; a stuck writer is 504 here)
        catch_up = max(timeout, DEFAULT_TIMEOUT_S)
        await self._reads.caught_up(t, time.monotonic() + catch_up, catch_up)
        r = t.rollouts
        if fields:
            await self._learning.learned(t)
        state = r.task(task)
        state.fields = fields or []
        rereads = 0
        while True:
            want = r.want(fields)  # None until some item has each field
            slots = (
                []
                if want is None
                else r.pick(state, want, batch_size, group_size, min_version, shape.where)
            )
            if shape.max_tokens is not None and slots:
                assert shape.length_field is not None
                lengths, read = await lengths_of(self._reads, t, slots, shape.length_field)
                rereads += 1
                if read and rereads < 4:  # values came from disk: pick again from what is now
                    continue
                kept, full = fit_budget(lengths, group_size, shape.max_tokens, batch_size)
                slots = slots[:kept]
                if full:
                    break
            elif len(slots) >= batch_size:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                if partial:
                    break
                raise DeadlineExceeded(
                    f"table {table!r}: {len(slots)} of {batch_size} items were ready for task "
                    f"{task!r} within {timeout:g} s"
                )
            await r.changed.wait(left)
            t = self._core.table(table)  # TableNotFound once dropped
            state = r.task(task)
        if not slots:
            return None, []
        assert want is not None  # items were picked for it
        # whole values past the cap are refused before anything is leased (the items stay
        # ready); values cut to ``fields`` are measured once cut, before the answer is built
        measure = int(t.size[slots].sum()) > self._core.max_answer_bytes
        if measure and (
            fields is None or all(mask == want for mask in r.field_masks.get_many(slots))
        ):
            raise self._core.too_big(int(t.size[slots].sum()), f"a claim of {len(slots)} items")
        lease = r.lease(state, slots, lease_s)
        self._leases.schedule(t, lease)
        try:
            items = await self._claimed(t, lease, slots, fields, want, measure=measure, shape=shape)
            if shape.world_size is not None:
                lease.ranks = self._ranks(t, items, shape)
            return lease, items
        except BaseException:
            r.cancel(lease)  # refused: nothing stays leased
            raise

    async def _claimed(
        self,
        t: Table,
        lease: Lease,
        slots: list[int],
        fields: list[str] | None,
        want: int,
        *,
        measure: bool = False,
        shape: ClaimShape | None = None,
    ) -> list[ClaimedItem]:
        """The items of a new lease, their values cut to ``fields`` (as stored when they
        have those fields alone); those deleted while their values were read from disk
        leave the lease. With ``measure``, values past ``--max-response-mb`` once cut are
        refused (:class:`ValidationFailed`)."""
        keys = list(lease.entries)
        values: list[Any] = [t.values[slot] for slot in slots]
        misses = [(i, slot, keys[i]) for i, slot in enumerate(slots) if values[i] is None]
        if misses:
            found: list[Any] = [None] * len(slots)
            await self._reads.read_misses(t, misses, found)
            for i, _, _ in misses:
                values[i] = None if found[i] is None else found[i].value
        out: list[ClaimedItem] = []
        gone: list[str] = []
        groups, versions = t.rollouts.groups, t.policy_version
        tag_of = t.rollouts.tag_index.get
        prios = t.priority[slots].tolist()
        masks = t.rollouts.field_masks.get_many(slots)
        shape = shape or ClaimShape()
        names = shape.returned(fields)
        as_stored = names is None or (names is fields and shape.select is None)
        lengths_by_slot = t.rollouts.lengths
        for key, slot, value, prio, mask in zip(keys, slots, values, prios, masks, strict=True):
            if value is None:
                gone.append(key)
                continue
            version = int(versions[slot])
            item = ClaimedItem(
                key,
                value if names is None or (as_stored and mask == want) else project(value, names),
                prio,
                groups.get(slot),
                None if version == NO_VERSION else version,
                tag_of(slot),
            )
            if shape.length_field is not None:
                known = lengths_by_slot.setdefault(slot, {})
                if shape.length_field not in known:
                    known[shape.length_field] = field_length(value, shape.length_field)
            if not shape.values:
                item.lengths = value_lengths(value, names)
                item.value = None
            out.append(item)
        if measure:
            nbytes = sum(len(it.key) + len(it.value or b"") for it in out)
            if nbytes > self._core.max_answer_bytes:
                raise self._core.too_big(nbytes, f"a claim of {len(out)} items")
        if gone:
            t.rollouts.drop_entries(lease, gone)
        return out

    @staticmethod
    def _ranks(t: Table, items: list[ClaimedItem], shape: ClaimShape) -> list[list[int]]:
        """The items split over ``shape.world_size`` ranks, balanced by the length field
        (by count without one), never splitting a group."""
        assert shape.world_size is not None
        name, index = shape.length_field, t.index
        lengths = [1] * len(items)
        if name is not None:
            cache = t.rollouts.lengths
            for i, it in enumerate(items):
                slot = index.get(it.key)
                lengths[i] = cache.get(slot, {}).get(name, 0) if slot is not None else 0
        return balance_ranks(lengths, [it.group for it in items], shape.world_size)

    def _lease(self, t: Table, lease_id: str) -> Lease:
        lease = t.rollouts.leases.get(lease_id)
        if lease is None or lease.deadline <= time.monotonic():
            if lease is not None:
                t.rollouts.expire(lease_id)
            raise LeaseNotFound(f"no live lease {lease_id!r} on table {t.name!r}")
        return lease

    async def ack(self, table: str, lease_id: str, keys: list[str] | None = None) -> int:
        """The lease's items of ``keys`` (all when None) count as consumed by its task,
        durably; returns how many of them are acknowledged (a repeat counts them again)."""
        t = self._core.table(table)
        writer = self._core.writer()
        r = t.rollouts
        lease = self._lease(t, lease_id)
        task = r.task(lease.task)
        count = 0
        newly: list[tuple[str, list[Any]]] = []
        for key in lease.keys(keys):
            entry = lease.entries[key]
            if entry[2] == "acked":
                count += 1
            elif entry[2] == "held" and r.live(lease, key) is not None:
                newly.append((key, entry))
        if not newly:
            return count
        acked = [key for key, _ in newly]
        self._core.reserve(len(acked), 0)
        for _, entry in newly:
            entry[2] = "acked"
            task.leased.pop(entry[1], None)
            task.unacked.pop(entry[1], None)
        task.acked += len(newly)
        s = self._core.state
        record = records.ack(table, lease.task, acked) if s.wal is not None else None
        seq = self._core.admit(record)
        t.pending.accept(seq, len(acked))
        writer.submit(AckOp(seq, weight=len(acked), table=t, task=lease.task, keys=acked))
        doomed = self._consumed(t, [(entry[0], entry[1], key) for key, entry in newly])
        if doomed:
            self._core.reserve(len(doomed), 0)
            seq, _ = self._core.enqueue_delete(writer, t, doomed, wait=False)
        try:
            await self._core.committed(seq, None)
        except BaseException:
            for _, entry in newly:  # refused: the items are the task's to consume again
                if entry[2] == "acked":
                    entry[2] = "held"
                    task.leased[entry[1]] = lease.id
                    task.unacked[entry[1]] = entry[0]
            task.acked -= len(newly)
            raise
        return count + len(newly)

    def _consumed(self, t: Table, acked: list[tuple[int, int, str]]) -> list[str]:
        """The keys of ``acked`` (slot, order, key) every task of the table's
        ``delete_after_ack`` has acknowledged now."""
        tasks = t.config.delete_after_ack
        if not tasks:
            return []
        r = t.rollouts
        doomed = []
        for slot, order, key in acked:
            for name in tasks:
                state = r.tasks.get(name)
                if state is not None:
                    if order in state.unacked:
                        break
                else:
                    bit = r.task_bits.known(name)
                    if bit is None or not r.acked_masks.get(slot) & bit:
                        break
            else:
                doomed.append(key)
        return doomed

    def expire_leases(self, *, before: float | None = None) -> None:
        """Release the leases whose deadline (``time.monotonic()``) is before ``before``
        (default: now), as the expiry task does when their time comes; tests pass a time
        ahead rather than sleep."""
        self._leases.expire_due(before)

    async def release(self, table: str, lease_id: str, keys: list[str] | None = None) -> int:
        """The lease's held items of ``keys`` (all when None) are ready for its task again."""
        t = self._core.table(table)
        lease = self._lease(t, lease_id)
        return t.rollouts.release(lease, lease.keys(keys))

    # -- policy versions ------------------------------------------------------------------

    async def set_version(self, table: str, version: int, *, force: bool = False) -> dict[str, int]:
        """Move the table's policy version forward; with ``max_staleness``, the rollouts
        it leaves behind are deleted. Raises VersionConflict for a lower version, and
        ValidationFailed for one more than :data:`MAX_VERSION_STEP` ahead unless ``force``."""
        t = self._core.table(table)
        writer = self._core.writer()
        r = t.rollouts
        current = r.version
        if version < current:
            raise VersionConflict(
                f"table {table!r} is at policy version {current}; it never goes back to {version}"
            )
        if version - current > MAX_VERSION_STEP and not force:
            raise ValidationFailed(
                f"version ({version}) is {version - current} past table {table!r}'s policy "
                f"version {current}, more than {MAX_VERSION_STEP} at once; a version never "
                'goes back, so send "force": true if this is meant'
            )
        if version == current:
            return {"version": current, "dropped_stale": r.dropped_stale}
        s = self._core.state
        record = records.version(table, version) if s.wal is not None else None
        seq = self._core.admit(record)
        r.version = version
        r.reservations.room.notify()  # waiting reservations check their version again
        t.pending.accept(seq, 0)
        writer.submit(VersionOp(seq, weight=0, table=t, version=version))
        stale = self._stale_keys(t)
        if stale:
            self._core.reserve(len(stale), 0)
            seq, _ = self._core.enqueue_delete(writer, t, stale, wait=False)
            r.dropped_stale += len(stale)
        try:
            await self._core.committed(seq, None)
        except BaseException:
            if r.version == version:
                r.version = current
            r.dropped_stale -= len(stale)
            raise
        return {"version": r.version, "dropped_stale": r.dropped_stale}

    def _stale_keys(self, t: Table) -> list[str]:
        """Keys of the items a reader sees whose version is below the staleness floor."""
        floor = t.rollouts.floor()
        if floor is None:
            return []
        n = len(t.keys)
        pv = t.policy_version[:n]
        pending = t.pending.entries
        keys: list[str] = []
        for slot in np.flatnonzero((pv >= 0) & (pv < floor)).tolist():
            key = t.keys[slot]
            if key is None:
                continue
            entry = pending.get(key)
            if entry is None or isinstance(entry[1], PatchedItem):
                keys.append(key)
        for key, entry in pending.items():
            it = entry[1]
            if it is not None and not isinstance(it, PatchedItem):
                if it.version is not None and it.version < floor:
                    keys.append(key)
        return keys

    def task_stats(self) -> dict[str, dict[str, dict[str, int]]]:
        """Per table with consumer tasks, each task's counts (for ``/metrics``)."""
        state = self._core.current_state
        if state is None or not self._core.is_open:
            return {}
        return {
            name: t.rollouts.counts()
            for name, t in state.tables.items()
            if t.rollouts.tasks and not t.dropping
        }

    async def tasks_now(self, table: str) -> dict[str, Any]:
        """:meth:`tasks` once the writer applied the writes accepted before (a read of
        ``/tasks`` sees a delete or a push that was answered)."""
        t = self._core.table(table)
        await self._reads.caught_up(t, time.monotonic() + DEFAULT_TIMEOUT_S, DEFAULT_TIMEOUT_S)
        return self.tasks(table)

    def tasks(self, table: str) -> dict[str, Any]:
        """``/tasks``: per task ready, leased, acknowledged and expired; the version."""
        r = self._core.table(table).rollouts
        return {
            "tasks": r.counts(),
            "version": r.version,
            "dropped_stale": r.dropped_stale,
            "reserved": r.reservations.reserved,
        }
