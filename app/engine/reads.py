"""The engine's reads part: ``get``, ``batchGet`` and ``sample``, merging each table's pending ops
(so a write is visible once accepted), reading values RocksDB holds in I/O threads."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from rlreplay.app.engine.core import DEFAULT_TIMEOUT_S, EngineCore
from rlreplay.app.storage.layout import value_key
from rlreplay.app.tables.draws import Draw
from rlreplay.app.tables.filtered_draws import selectable
from rlreplay.app.tables.items import (
    Item,
    ItemBatch,
    SampleBatch,
    SampledItem,
)
from rlreplay.app.tables.rollouts import NO_VERSION
from rlreplay.app.tables.stacking import stack_values
from rlreplay.app.tables.table import Table
from rlreplay.app.tables.tag_index import Condition
from rlreplay.app.writer.ops import (
    PopulateOp,
)
from rlreplay.app.writer.state import cache_charge
from rlreplay.wire.errors import (
    DeadlineExceeded,
    ValidationFailed,
)

log = logging.getLogger(__name__)

# A value read from RocksDB is populated back into the cache only if it takes at most
# 1/POPULATE_FRACTION of the cache: bigger ones would only push out a crowd of others.
POPULATE_FRACTION = 8


class Reads:
    """Reads and samples (the ``reads`` part of :class:`~rlreplay.app.engine.engine.Engine`):
    they run in the caller's task, over the tables of ``core``'s state."""

    def __init__(self, core: EngineCore) -> None:
        self._core = core

    async def get(self, table: str, key: str) -> Item | None:
        """The item as a reader sees it now, or None."""
        return (await self.get_many(table, [key]))[0]

    async def get_many(self, table: str, keys: Sequence[str]) -> list[Item | None]:
        """Items in the order asked, None where missing."""
        return (await self.get_batch(table, keys)).items()

    async def get_batch(self, table: str, keys: Sequence[str]) -> ItemBatch:
        """Items in the order asked, as columns (``values[i]`` None where missing)."""
        t = self._core.item_table(table, "get and items:batchGet")
        index, values = t.index, t.values
        if not t.pending.entries:  # the common case: one vectorised pass over cached items
            slots = list(map(index.get, keys))
            if None not in slots:
                vals = list(map(values.__getitem__, slots))  # type: ignore[arg-type]
                if None not in vals:
                    sl = np.array(slots, dtype=np.int64)
                    nbytes = int(t.size[sl].sum())
                    if nbytes > self._core.max_answer_bytes:
                        raise self._core.too_big(nbytes, f"a batchGet of {len(keys)} keys")
                    t.touch(sl)
                    batch = ItemBatch(
                        keys, vals, t.priority[sl], t.inserted_at[sl], t.times_sampled[sl]
                    )
                    if t.rollouts.has_meta:
                        batch.groups, batch.versions, batch.tags = rollout_meta(t, slots)  # type: ignore[arg-type]
                    return batch
        out: list[Item | None] = [None] * len(keys)
        pending = t.pending.entries
        misses: list[tuple[int, int, str]] = []
        for i, key in enumerate(keys):
            if pending:
                entry = pending.get(key)
                if entry is not None:
                    item = entry[1]
                    if item is not None:
                        out[i] = Item(
                            key,
                            item.value,
                            item.priority,
                            entry[2],
                            0,
                            item.group,
                            item.version,
                            item.tags,
                        )
                    continue
            slot = index.get(key)
            if slot is None:
                continue
            value = values[slot]
            if value is None:
                misses.append((i, slot, key))
                continue
            t.touch(slot)
            out[i] = Item(
                key,
                value,
                float(t.priority[slot]),
                float(t.inserted_at[slot]),
                int(t.times_sampled[slot]),
                *rollout_of(t, slot),
            )
        nbytes = sum(len(it.key) + len(it.value) for it in out if it is not None)
        nbytes += int(t.size[[slot for _, slot, _ in misses]].sum()) if misses else 0
        if nbytes > self._core.max_answer_bytes:
            raise self._core.too_big(nbytes, f"a batchGet of {len(keys)} keys")
        if misses:
            await self.read_misses(t, misses, out)
        return ItemBatch.of(keys, out)

    async def read_misses(
        self, t: Table, misses: list[tuple[int, int, str]], out: list[Any]
    ) -> None:
        """Fill ``out[i]`` for values not in the cache, from RocksDB; schedules populates."""
        s = self._core.state
        assert s.store is not None
        metas = [
            (
                float(t.priority[slot]),
                float(t.inserted_at[slot]),
                int(t.times_sampled[slot]),
                int(t.version[slot]),
                *rollout_of(t, slot),
            )
            for _, slot, _ in misses
        ]
        found = await s.io.run(s.store.get_many, [value_key(t.prefix, key) for _, _, key in misses])
        writer = self._core.processor
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
                    housekeeping=True,
                )
            assert value is not None
            out[i] = Item(key, value, meta[0], meta[1], meta[2], meta[4], meta[5], meta[6])

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
        stacked: bool = False,
        where: list[Condition] | None = None,
    ) -> SampleBatch:
        """``batch_size`` draws from the table's sampler, after its pending ops are applied.

        A table with no items makes the call wait up to ``timeout_s`` for one (as Reverb's
        default ``MinSize(1)``); the rate limiter may make it wait too. Past the timeout:
        :class:`DeadlineExceeded`. With ``stacked`` (and values), the batch's ``columns``
        hold the values stacked by field; values that do not stack raise
        :class:`ValidationFailed`, and like every refusal here the sample then consumes
        nothing.
        """
        if batch_size < 1:
            raise ValidationFailed(f"batch_size ({batch_size}) must be >= 1")
        t = self._core.table(table)
        timeout = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        if t.gate.limited:
            await t.gate.acquire_sample(batch_size, timeout)
        try:
            await self.caught_up(t, deadline, timeout)
            if where:  # an empty filter holds for every item
                drawn, size = await self._draw_where(t, batch_size, where, deadline, timeout)
            else:
                while len(t.sampler) == 0:
                    left = deadline - time.monotonic()
                    if left <= 0 or not await t.pending.wait_nonempty(left):
                        raise DeadlineExceeded(
                            f"table {table!r} had no item to sample within {timeout:g} s"
                        )
                    await self.caught_up(t, deadline, timeout)
                drawn = t.draw(batch_size, self._core.rng)
                size = len(t.sampler) + len(drawn.exhausted)
            slots, probs, exhausted = drawn.slots, drawn.probabilities, drawn.exhausted
            if include_values:
                nbytes = int(t.size[slots].sum())
                if nbytes > self._core.max_answer_bytes:
                    t.undraw(drawn)
                    raise self._core.too_big(nbytes, f"a sample of {len(slots)} items")
        except BaseException:
            if t.gate.limited:
                t.gate.refund_sample(batch_size)
            raise
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
        if t.rollouts.has_meta:
            batch.groups, batch.versions, batch.tags = rollout_meta(t, slot_list)
        if include_values:
            t.touch(slots)
            if None in batch.values:
                try:  # RocksDB reads wait behind checkpoints in the I/O threads: keep the deadline
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        await self._fill_sampled_misses(t, slot_list, batch)
                except TimeoutError:
                    t.undraw(drawn)
                    t.counters.samples -= len(slots)
                    if t.gate.limited:
                        t.gate.refund_sample(batch_size)
                    raise DeadlineExceeded(
                        f"table {table!r}: reading the sampled values from disk took more "
                        f"than {timeout:g} s"
                    ) from None
            if stacked:
                try:
                    batch.columns = stack_values(batch.keys, cast("list[bytes]", batch.values))
                except ValidationFailed:
                    t.undraw(drawn)
                    t.counters.samples -= len(slots)
                    if t.gate.limited:
                        t.gate.refund_sample(batch_size)
                    raise
        elif stacked:
            batch.columns = {}
        if exhausted and not t.dropped and not t.dropping:  # no log record past its drop
            self._core.enqueue_delete(self._core.writer(), t, exhausted, wait=False)
        return batch

    async def _draw_where(
        self, t: Table, n: int, where: list[Condition], deadline: float, waited_s: float
    ) -> tuple[Draw, int]:
        """A draw among the items ``where`` matches, waiting (no polling) for one; and how
        many were selectable (what the weights are relative to)."""
        while True:
            slots = selectable(t, t.rollouts.tag_index.match(where))
            if len(slots):
                return t.draw_among(n, self._core.rng, slots), len(slots)
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(
                    f"table {t.name!r} had no item matching the filter within {waited_s:g} s"
                )
            await t.rollouts.changed.wait(left)
            t = self._core.table(t.name)
            await self.caught_up(t, deadline, waited_s)

    async def _fill_sampled_misses(
        self, t: Table, slot_list: list[int], batch: SampleBatch
    ) -> None:
        """Read the values of picks not in the cache; drop picks deleted meanwhile."""
        values = batch.values
        misses = [(i, sl, batch.keys[i]) for i, sl in enumerate(slot_list) if values[i] is None]
        found: list[Any] = [None] * len(values)
        await self.read_misses(t, misses, found)
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
            if batch.groups is not None and batch.versions is not None:
                batch.groups = [batch.groups[i] for i in keep]
                batch.versions = [batch.versions[i] for i in keep]
            if batch.tags is not None:
                batch.tags = [batch.tags[i] for i in keep]

    async def caught_up(self, t: Table, deadline: float, waited_s: float) -> None:
        """Wait until the writer applied what was accepted for ``t``, by the deadline."""
        if t.pending.applied_seq >= t.pending.accepted_seq:
            return
        self._core.writer()  # Unavailable when it has died: nothing would ever catch up
        if not await t.pending.caught_up(deadline - time.monotonic()):
            raise DeadlineExceeded(
                f"table {t.name!r}: the writes accepted before this sample were not applied "
                f"within {waited_s:g} s; retry"
            )


def rollout_of(t: Table, slot: int) -> tuple[str | None, int | None, dict[str, Any] | None]:
    """An item's group, policy version and tags (None where it has none)."""
    if not t.rollouts.has_meta:
        return None, None, None
    version = int(t.policy_version[slot])
    return (
        t.rollouts.groups.get(slot),
        None if version == NO_VERSION else version,
        t.rollouts.tag_index.get(slot),
    )


def rollout_meta(
    t: Table, slots: list[int]
) -> tuple[list[str | None], list[int | None], list[dict[str, Any] | None] | None]:
    """The groups, policy versions and tags of ``slots`` (None where an item has none;
    no tags list when the table holds no tags)."""
    groups = t.rollouts.groups
    versions = t.policy_version[slots].tolist()
    tag_index = t.rollouts.tag_index
    tags = [tag_index.get(slot) for slot in slots] if tag_index.of else None
    return [groups.get(slot) for slot in slots], [None if v < 0 else v for v in versions], tags
