"""Learning which fields the items of a table have, for claims that ask for fields.

Pushes record the fields of their values only once a table's first claim that asks for
fields started the learning (``Rollouts.learning``): a table nobody claims fields from
never reads its values to find out. :class:`FieldLearning` owns those scans: one per table,
cancelled when the table is dropped or the engine stops.
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np

from rlreplay.app.engine.core import EngineCore
from rlreplay.app.storage.layout import value_key
from rlreplay.app.tables.table import Table

__all__ = ["FieldLearning"]

#: Items whose fields a claim learns between turns it gives the event loop.
_LEARN_YIELD_EVERY = 4096


class FieldLearning:
    """The field-learning scans of every table (see the module docstring)."""

    def __init__(self, core: EngineCore) -> None:
        self._core = core
        self._scans: set[asyncio.Task[None]] = set()

    async def stop(self) -> None:
        """Cancel every scan; idempotent."""
        scans = list(self._scans)
        for scan in scans:
            scan.cancel()
        for scan in scans:
            with contextlib.suppress(asyncio.CancelledError):
                await scan

    async def learned(self, t: Table) -> None:
        """Return once every item's fields are known: pushes record them only from the
        table's first claim that asks for fields on (see ``Rollouts.learning``), so
        that claim learns those of the items pushed before; claims that come meanwhile
        wait for the same learning, and one that fails is tried again by the next claim."""
        r = t.rollouts
        learning = r.learning
        if learning is None:
            # started: pushes applied from now on record their own fields
            learning = r.learning = asyncio.get_running_loop().create_task(
                self._learn(t), name=f"rlreplay-learn-fields-{t.name}"
            )
            self._scans.add(learning)
            learning.add_done_callback(self._scans.discard)
        if not learning.done():
            await asyncio.shield(learning)
        learning.result()

    async def _learn(self, t: Table) -> None:
        """Record the fields of the items whose fields are not known, reading the values
        the cache does not hold from RocksDB; the event loop gets a turn every few thousand
        items. Marks their metadata for the next checkpoint, so a restart knows them. (Not
        ``_read_misses``: it would queue a cache populate for every value read here.)"""
        r = t.rollouts
        relearn = r.relearn
        try:
            n = len(t.keys)
            unknown = r.field_masks.empty(n)
            if relearn:  # saved by a version that dropped names: every item again
                unknown[:] = True
            misses: list[tuple[int, str, int]] = []  # slot, key, value version
            for i, slot in enumerate(np.flatnonzero(unknown).tolist()):
                if i % _LEARN_YIELD_EVERY == _LEARN_YIELD_EVERY - 1:
                    await asyncio.sleep(0)  # the writer may free or reuse slots meanwhile
                key, value = t.keys[slot], t.values[slot]
                if key is None:
                    continue
                if value is None:
                    misses.append((slot, key, int(t.version[slot])))
                    continue
                r.on_patch(slot, value)
                t.mark_meta_dirty(slot)
            store = self._core.state.store
            for start in range(0, len(misses), _LEARN_YIELD_EVERY):
                chunk = misses[start : start + _LEARN_YIELD_EVERY]
                assert store is not None  # values leave the cache for RocksDB only
                found = await self._core.state.io.run(
                    store.get_many, [value_key(t.prefix, key) for _, key, _ in chunk]
                )
                for (slot, key, version), value in zip(chunk, found, strict=True):
                    # one replaced, patched or freed meanwhile has its fields recorded
                    if value is not None and t.keys[slot] == key and t.version[slot] == version:
                        r.on_patch(slot, value)
                        t.mark_meta_dirty(slot)
        except BaseException:
            r.learning = None  # the next claim tries again
            raise
        if relearn:
            r.relearn = False
