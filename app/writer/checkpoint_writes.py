"""A checkpoint's writes to RocksDB, in steps sized so that none holds the event loop long.

rocksdict holds the GIL while it writes, so each step runs in an I/O thread and is small
(:data:`STEP_BYTES`, :data:`STEP_SLOTS`): the loop gets the GIL back between steps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rlreplay.app.storage.rocks import RocksStore
from rlreplay.workers.blocking import BlockingIO

__all__ = ["STEP_BYTES", "STEP_SLOTS", "CheckpointWrites"]

STEP_BYTES = 1 << 20
STEP_SLOTS = 2048  # slots a step visits at most (metadata-only steps)
_STALL_WAIT_S = 0.005  # the wait before a write RocksDB refused to stall is tried again


class CheckpointWrites:
    """A checkpoint's writes to RocksDB, one step at a time, in an I/O thread; a write
    RocksDB would make wait (for a memtable flush) waits here instead, GIL released."""

    def __init__(self, store: RocksStore, io: BlockingIO) -> None:
        self._store, self._io = store, io
        self.bytes = 0

    async def write(
        self,
        puts: Sequence[tuple[bytes, bytes]],
        deletes: Sequence[bytes],
        ranges: Sequence[tuple[bytes, bytes]],
        *,
        step_bytes: int = STEP_BYTES,
    ) -> None:
        """Write ``ranges``, then ``deletes`` (in batches of :data:`STEP_SLOTS`: a FIFO
        table's removals queue thousands), then ``puts`` (in batches of about
        ``step_bytes``, or :data:`STEP_SLOTS` keys), in this order."""
        for at in range(0, len(deletes), STEP_SLOTS):
            await self._write((), deletes[at : at + STEP_SLOTS], ranges if not at else ())
        if ranges and not deletes and not puts:
            await self._write((), (), ranges)
        at = 0
        while at < len(puts):
            end, size = at, 0
            while end < len(puts) and size < step_bytes and end - at < 2 * STEP_SLOTS:
                size += len(puts[end][1])
                end += 1
            await self._write(puts[at:end], (), ranges if not (at or deletes) else ())
            at = end

    async def write_batch(self, puts: Sequence[tuple[bytes, bytes]]) -> None:
        """Write ``puts`` as one batch (a checkpoint's step, sized by its caller)."""
        await self._write(puts, (), ())

    async def write_atomic(
        self,
        puts: Sequence[tuple[bytes, bytes]],
        deletes: Sequence[bytes],
        ranges: Sequence[tuple[bytes, bytes]],
    ) -> None:
        """Write ``ranges``, ``deletes`` and ``puts`` as one batch, whatever its size: a
        crash keeps all of it or none (the whole idempotency window, rarely)."""
        await self._write(puts, deletes, ranges)

    async def _write(
        self,
        puts: Sequence[tuple[bytes, bytes]],
        deletes: Sequence[bytes],
        ranges: Sequence[tuple[bytes, bytes]],
    ) -> None:
        # polled: RocksDB tells no one when its flush is done
        while not await self._io.run(self._store.try_write, puts, deletes, ranges):  # noqa: ASYNC110
            await asyncio.sleep(_STALL_WAIT_S)
        self.bytes += sum(len(k) + len(v) for k, v in puts) + sum(len(k) for k in deletes)
