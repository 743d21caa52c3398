"""Checkpoints: what the writer applied is made durable without the log, then the log it
covers is cut; and captures, the same at one point of the op order, for a snapshot.

The storage mode does the writing (:mod:`rlreplay.app.writer.storage`); a checkpoint that fails
(a full disk) leaves the log uncut, and the writer tries again with backoff.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlreplay.app.writer.state import EngineState


class Checkpointer:
    """The writer's checkpoints and captures, which the task processor holds.

    Args:
        state: The engine's state (tables, storage, log).
        oldest_queued_seq: The sequence number of the oldest logged op still queued for the
            writer (the task processor's :meth:`oldest_queued_seq`): a checkpoint covers
            the ops before it.
    """

    def __init__(self, state: EngineState, *, oldest_queued_seq: Callable[[], int | None]) -> None:
        self._state = state
        self._oldest_queued_seq = oldest_queued_seq
        #: The log position the last checkpoint covered (set by the engine on recovery).
        self.horizon = 0

    async def checkpoint(self, *, full: bool = False) -> None:
        """Make what is applied durable without the log, then drop the log it covers.

        The storage decides how far (:meth:`~rlreplay.app.writer.storage.Storage.cut`): memory
        mode writes every table to its checkpoint file; hybrid and disk modes, with the log
        on and unless ``full``, write only values logged before the previous checkpoint, so
        the log then holds up to about three intervals (two, and the segment the cut falls
        in: about ``3 x wal_checkpoint_mb``), and a restart replays them.
        """
        s = self._state
        wal = s.wal
        if wal is None and not s.storage.checkpoints_without_log:
            return
        if wal is not None:
            await wal.rotate()
        oldest = self._oldest_queued_seq()
        covered = (oldest - 1) if oldest is not None else s.seq
        upto = s.storage.cut(covered, self.horizon, full=full, logged=wal is not None)
        await s.storage.checkpoint(s, covered, upto)
        self.horizon = covered
        if wal is not None:
            await wal.truncate(upto)

    async def capture(self, dest: Path) -> dict[str, Any]:
        """Capture every table into the empty folder ``dest`` as a data directory that a
        server can start from, at this point of the op order; returns what it holds.

        Hybrid and disk modes make everything applied durable in RocksDB (a full
        checkpoint, which also cuts the log) and take RocksDB's checkpoint into
        ``dest/rocksdb`` (hard links to its immutable files: the upload then reads them
        while the writer goes on). Memory mode writes its checkpoint file into ``dest``.
        """
        s = self._state
        oldest = self._oldest_queued_seq()
        covered = (oldest - 1) if oldest is not None else s.seq
        await s.io.run(dest.mkdir, parents=True, exist_ok=True)
        if s.storage.captures_after_checkpoint:
            await self.checkpoint(full=True)
        await s.storage.capture(s, dest, covered)
        in_rocksdb = s.store is not None  # everything is, after the full checkpoint
        return {
            "mode": s.mode,
            "lsn": covered,
            "tables": {
                t.name: {
                    "items": len(t.index),
                    "bytes": t.bytes_on_disk if in_rocksdb else t.bytes_in_cache,
                    **({"episodes": True} if t.episodes is not None else {}),
                }
                for t in s.tables.values()
                if not t.dropped
            },
        }
