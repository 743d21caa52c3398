"""A table's change feed and whole selection state, for followers such as the GPU sidecar.

Both read the applied state on the event loop's thread, where the writer also runs, so an
index and the feed's ``seq`` always describe the same moment: a follower that loads the
index and then applies the events after its ``seq`` in order holds the server's state.
Both first wait (briefly) for the writer to apply what was accepted before the call, so a
follower reads its writes, as every other reader does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.app.engine.core import DEFAULT_TIMEOUT_S, EngineCore
from rlreplay.app.tables.changes import ChangeFeed
from rlreplay.wire.errors import Unavailable
from rlreplay.wire.schemas import ChangeList

__all__ = ["read_changes", "read_index"]


def _feed(core: EngineCore, table: str) -> ChangeFeed:
    """The table's feed, started now if nobody followed it yet."""
    return core.table(table).follow(core.settings.changes_keep)


async def read_changes(
    core: EngineCore, table: str, since: int, limit: int, wait_s: float
) -> ChangeList:
    """Up to ``limit`` events after ``since``, waiting up to ``wait_s`` for the first one.

    Raises:
        TableNotFound: No such table (or it was dropped while waiting).
        Gone: ``since`` is not a number this feed can answer from (see ``ChangeFeed``).
    """
    feed = _feed(core, table)
    if core.waits_ended is not None:  # the server stops (a feed started since included)
        feed.end_waits(core.waits_ended)
    feed.events(since, 0)  # Gone now rather than after the wait
    await core.table(table).pending.caught_up(DEFAULT_TIMEOUT_S)
    await feed.wait(since, wait_s)
    feed = _feed(core, table)  # dropped meanwhile: TableNotFound
    if feed.closed:  # its writer stopped: no event will come
        raise Unavailable("the writer stopped; the feed resumes after a restart (new epoch)")
    return ChangeList(feed.seq, feed.epoch, feed.events(since, limit))


async def read_index(core: EngineCore, table: str) -> dict[str, Any]:
    """The table's keys, priorities and insertion times, oldest insert first, with the
    feed's ``seq`` and ``epoch`` (the fields of :class:`~rlreplay.wire.schemas.TableIndex`)."""
    await core.table(table).pending.caught_up(DEFAULT_TIMEOUT_S)
    t = core.table(table)
    feed = t.follow(core.settings.changes_keep)
    slots = np.fromiter(t.index.values(), dtype=np.int64, count=len(t.index))
    slots = slots[np.argsort(t.order[slots], kind="stable")]
    keys = t.keys
    return {
        "seq": feed.seq,
        "epoch": feed.epoch,
        "keys": [keys[s] for s in slots.tolist()],
        "priorities": t.priority[slots],
        "inserted_at": t.inserted_at[slots],
    }
