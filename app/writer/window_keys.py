"""The idempotency window in RocksDB: one key per answered id, written by changes.

A checkpoint writes what the window changed since the last one
(:meth:`~rlreplay.app.writer.request_ids.RequestIds.take_changes`): the ids answered
since, and deletes for the ids dropped since. Its work on the window thus follows the
writes of one interval, while the window holds 10 minutes of them: a window packed whole
at each checkpoint made each one longer than the last, and its packing, Python work in
an I/O thread, made the event loop wait for the GIL at every hand-over.

The rows are read and packed on the event loop, :data:`SLICE` ids at a time (a
millisecond or two), and each slice is written as a step of the checkpoint
(:class:`~rlreplay.app.writer.checkpoint_writes.CheckpointWrites`), with the writer's
``between`` run after it. They go before the checkpoint's log position, like every step:
a crash before that position is written replays the log, which remembers the same ids.

A window that must be written whole (:attr:`WindowChanges.whole`: no checkpoint took its
changes for long) replaces every saved id in one batch, so a crash leaves the old keys or
the new ones, never a window with some missing. A data directory whose window is the one
value earlier versions wrote (:data:`~rlreplay.app.storage.layout.REQUEST_IDS_KEY`) loads
it as ids not yet saved: the next checkpoint writes them as keys and deletes the value.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from operator import itemgetter

import msgpack

from rlreplay.app.storage import layout
from rlreplay.app.storage.rocks import RocksStore
from rlreplay.app.writer.checkpoint_writes import CheckpointWrites
from rlreplay.app.writer.request_ids import RequestIds, WindowChanges

__all__ = ["SLICE", "load_window", "save_window"]

#: Ids whose rows a step reads and packs on the event loop.
SLICE = 1024


async def save_window(
    ids: RequestIds,
    changes: WindowChanges,
    steps: CheckpointWrites,
    between: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Write ``changes`` (taken from ``ids``) to RocksDB; returns the ids written. The
    caller gives them back to ``ids`` if this raises."""
    gained, written = changes.gained, 0
    if changes.whole:
        puts: list[tuple[bytes, bytes]] = []
        for at in range(0, len(gained), SLICE):
            puts.extend(layout.request_id_puts(ids.rows(gained[at : at + SLICE])))
            if between is not None:
                await between()
        await steps.write_atomic(puts, [], [layout.REQUEST_ID_RANGE])
        return len(puts)
    deletes = layout.request_id_keys(changes.lost)
    for at in range(0, len(gained), SLICE):
        puts = layout.request_id_puts(ids.rows(gained[at : at + SLICE]))
        await steps.write(puts, deletes if not at else (), ())
        written += len(puts)
        if between is not None:
            await between()
    if deletes and not gained:
        await steps.write((), deletes, ())
    return written


def load_window(store: RocksStore, ids: RequestIds) -> bool:
    """Load the window RocksDB holds into ``ids`` (blocking: in an I/O thread), oldest
    first; returns whether it found the one value of earlier versions (the next
    checkpoint deletes it)."""
    rows = [(*layout.request_id_row(k, v), True) for k, v in store.scan(layout.REQUEST_ID_PREFIX)]
    old = store.get(layout.REQUEST_IDS_KEY)
    if old is not None:
        rows.extend(
            (str(rid), float(at), kind, body, False)
            for rid, at, kind, body in msgpack.unpackb(old, raw=False)
        )
    rows.sort(key=itemgetter(1))
    for rid, at, _kind, body, saved in rows:
        ids.remember(rid, dict(body), at, saved=saved)
    return old is not None
