"""Expiry of unconsumed items: a table's ``ttl_s`` (the contract's "Expiry").

An item not acknowledged by every task of the table's ``delete_after_ack`` within
``ttl_s`` seconds of its push is deleted: consumed items are deleted on their last
acknowledgement, so every item still in the table past its time goes (with no
``delete_after_ack``, nothing consumes an item, and each goes ``ttl_s`` after its push).
A group goes whole: its other items go with its oldest. Deletes go through the writer and
the log like any other, and are counted in the table's ``expired`` stat.

:class:`ItemExpiry` owns one background task that sweeps the tables with a ``ttl_s``
every quarter of the shortest one (at least 50 ms, at most 1 s). A sweep looks only at
the items that grew old since the last sweep (their insertion times fall between the two
cutoffs), so its cost follows what expires, not the table's size. A sweep that fails is
logged and counted (``failures``) and tried again at the next turn; it never stops the
service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time

import numpy as np

from rlreplay.app.engine.core import EngineCore
from rlreplay.app.tables.items import PatchedItem
from rlreplay.app.tables.table import Table

__all__ = ["ItemExpiry"]

log = logging.getLogger("rlreplay.expiry")

#: Bounds of the time between sweeps.
_MIN_PERIOD_S = 0.05
_MAX_PERIOD_S = 1.0


def _settled(t: Table, key: str | None) -> bool:
    """Whether ``key`` is an item readers see as the writer holds it (not being deleted or
    replaced by an op not applied yet; a pending patch keeps the item)."""
    if key is None:
        return False
    entry = t.pending.entries.get(key)
    return entry is None or isinstance(entry[1], PatchedItem)


class ItemExpiry:
    """The ``ttl_s`` sweeps of every table, in one owned task (``start``/``stop``)."""

    def __init__(self, core: EngineCore) -> None:
        self._core = core
        self._task: asyncio.Task[None] | None = None
        self._swept_to: dict[int, tuple[Table, float]] = {}  # id(table) → (table, cutoff)
        self.failures = 0

    def start(self) -> None:
        """Start the sweeping task."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="rlreplay-item-expiry"
            )

    async def stop(self) -> None:
        """Stop the task; idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def sweep(self, *, now: float | None = None) -> int:
        """Delete the items of every table past its ``ttl_s`` at ``now`` (unix time,
        default the present; tests pass a time ahead); returns how many."""
        state = self._core.current_state
        if state is None or not self._core.is_open:
            return 0
        now = time.time() if now is None else now
        live = {id(t) for t in state.tables.values()}
        for key in [k for k in self._swept_to if k not in live]:
            del self._swept_to[key]
        expired = 0
        for t in list(state.tables.values()):
            ttl = t.config.ttl_s
            if ttl is None or t.dropping or t.dropped:
                continue
            try:
                expired += self._sweep_table(t, now - ttl)
            except Exception:  # one table's failure must not stop the others' expiry
                self.failures += 1
                log.exception("expiring the items of table %r failed", t.name)
        return expired

    def _sweep_table(self, t: Table, cutoff: float) -> int:
        since = self._swept_to.get(id(t), (t, -math.inf))[1]
        if cutoff <= since:
            return 0
        n = len(t.keys)
        inserted = t.inserted_at[:n]
        old = np.flatnonzero((inserted < cutoff) & (inserted >= since)).tolist()
        keys = t.keys
        doomed = {slot for slot in old if _settled(t, keys[slot])}
        if doomed:
            doomed |= self._group_mates(t, doomed)
            names = [k for slot in sorted(doomed) if (k := keys[slot]) is not None]
            self._core.reserve(len(names), 0)
            self._core.enqueue_delete(self._core.writer(), t, names, wait=False)
            t.rollouts.expired += len(names)
            log.info("table %r: %d items expired (ttl_s %g)", t.name, len(names), t.config.ttl_s)
        self._swept_to[id(t)] = (t, cutoff)
        return len(doomed)

    @staticmethod
    def _group_mates(t: Table, slots: set[int]) -> set[int]:
        """The other items of the groups of ``slots`` (a group goes whole)."""
        groups = t.rollouts.groups
        wanted = {g for slot in slots if (g := groups.get(slot)) is not None}
        if not wanted:
            return set()
        keys = t.keys
        return {
            slot for slot, group in groups.items() if group in wanted and _settled(t, keys[slot])
        }

    def _period(self) -> float:
        state = self._core.current_state
        ttls = (
            []
            if state is None
            else [t.config.ttl_s for t in state.tables.values() if t.config.ttl_s is not None]
        )
        if not ttls:
            return _MAX_PERIOD_S
        return min(_MAX_PERIOD_S, max(_MIN_PERIOD_S, min(ttls) / 4))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._period())
            self.sweep()
