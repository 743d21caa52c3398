"""Checkpoints: what the writer applied is made durable without the log, then the log it
covers is cut; and captures, the same at one point of the op order, for a snapshot.

The storage mode does the writing (:mod:`rlreplay.app.writer.storage`); a checkpoint that fails
(a full disk) leaves the log uncut, and the writer tries again with backoff.

When one is due (:meth:`Checkpointer.due`): when the log since the last checkpoint passes
``--wal-checkpoint-mb`` (a cap), or sooner when replaying what a restart would replay would
take longer than ``--recovery-bound-s`` at the log's replay rate (measured by the last
start on this data that replayed enough of it, and saved with the checkpoints;
:data:`REPLAY_BYTES_S` until one has), counting what the log
will grow by while the checkpoint runs (its growth rate times the last checkpoint's time),
and an interval as at least as long as the one before it (see :meth:`Checkpointer.due`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlreplay.app.writer.loop_stalls import LoopStalls
from rlreplay.app.writer.state import EngineState

if TYPE_CHECKING:
    from rlreplay.app.log.wal import WriteAheadLog

#: Bytes of log a start gets through per second (its checkpoint after replay included),
#: until a start on this data has measured it: under what every restart of
#: ``bench.ingest`` measured on its 2-core machine at loads of 2 to 8 (see
#: docs/durability.md for the figures, and for a busier machine's).
REPLAY_BYTES_S = 40 * 2**20
#: A start that replayed less than this keeps the rate it had (a small log times badly).
_MEASURE_AFTER_BYTES = 64 * 2**20
#: The least log a checkpoint waits for, whatever the bound says (no checkpoint storms).
_LEAST_INTERVAL_BYTES = 16 * 2**20


@dataclass(slots=True)
class CheckpointStats:
    """What checkpoints cost, and what a restart took, for ``/metrics``."""

    checkpoints: int = 0
    seconds_total: float = 0.0
    last_seconds: float = 0.0
    longest_seconds: float = 0.0
    bytes_total: int = 0
    last_bytes: int = 0
    #: The longest event-loop stall during the last checkpoint, and during any.
    last_loop_stall_s: float = 0.0
    longest_loop_stall_s: float = 0.0
    #: Seconds the start took to bring the tables back (storage, log replay, checkpoint).
    recovery_s: float = 0.0
    #: Bytes of log a replay goes through per second (measured, or the default).
    replay_bytes_s: float = float(REPLAY_BYTES_S)
    #: Bytes a restart now would replay, and the bound on its time (0: none).
    replay_bytes: int = 0
    recovery_bound_s: float = 0.0


class Checkpointer:
    """The writer's checkpoints and captures, which the task processor holds.

    Args:
        state: The engine's state (tables, storage, log).
        oldest_queued_seq: The sequence number of the oldest logged op still queued for the
            writer (the task processor's :meth:`oldest_queued_seq`): a checkpoint covers
            the ops before it.
        between_steps: What runs between the steps of a RocksDB checkpoint (the task
            processor applies the pushes queued meanwhile), so the writer goes on.
    """

    def __init__(
        self,
        state: EngineState,
        *,
        oldest_queued_seq: Callable[[], int | None],
        between_steps: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._state = state
        self._oldest_queued_seq = oldest_queued_seq
        self._between_steps = between_steps
        #: The log position the last checkpoint covered (set by the engine on recovery).
        self.horizon = 0
        st = state.settings
        self._cap_bytes = int(st.wal_checkpoint_mb * 2**20)
        self.stats = CheckpointStats(recovery_bound_s=st.recovery_bound_s)
        self._previous_interval = 0  # log bytes of the interval before this one
        self._interval_started = time.monotonic()
        self._growth_bytes_s = 0.0  # the log's growth, over the last interval

    def due(self, wal: WriteAheadLog) -> bool:
        """Whether the log calls for a checkpoint now (see the module's docstring).

        A restart replays the log from the position the previous checkpoint covered
        (hybrid and disk modes cut there; see :meth:`checkpoint`): the last interval's log
        and this one's, and this one grows while the checkpoint runs. An interval is
        counted as at least as long as the one before it: it is the previous one at the
        next checkpoint.
        """
        since = wal.bytes_since_checkpoint
        if since > self._cap_bytes:
            return True
        stats = self.stats
        elapsed = time.monotonic() - self._interval_started
        growth = max(self._growth_bytes_s, since / elapsed if elapsed > 0 else 0.0)
        stats.replay_bytes = self._previous_interval + since
        if not stats.recovery_bound_s or since < _LEAST_INTERVAL_BYTES:
            return False
        # this interval becomes the previous one of the next checkpoint, which a restart
        # replays too: it may take half the bound at most (the first one, with no
        # previous interval, would otherwise take it all, and the next twice as much)
        ahead = max(self._previous_interval, since) + since + growth * stats.last_seconds
        return ahead > stats.replay_bytes_s * stats.recovery_bound_s

    def note_recovery(self, seconds: float, replayed_bytes: int, replay_s: float) -> None:
        """The start took ``seconds``, of which ``replay_s`` replaying ``replayed_bytes``
        of log: the rate the cadence counts on, once enough was replayed, is the log's
        bytes per second of the whole start (the checkpoint after replay writes them).
        The storage saves it with each checkpoint, so later starts count on it too (one
        that replays too little to measure keeps the rate the storage loaded)."""
        self.stats.recovery_s = seconds
        storage = self._state.storage
        if replayed_bytes >= _MEASURE_AFTER_BYTES and seconds > 0:
            storage.replay_bytes_s = replayed_bytes / seconds
        if storage.replay_bytes_s > 0:
            self.stats.replay_bytes_s = storage.replay_bytes_s

    async def checkpoint(self, *, full: bool = False) -> None:
        """Make what is applied durable without the log, then drop the log it covers.

        The storage decides how far (:meth:`~rlreplay.app.writer.storage.Storage.cut`): memory
        mode writes every table to its checkpoint file; hybrid and disk modes, with the log
        on and unless ``full``, write only values logged before the previous checkpoint, so
        the log then holds up to about three intervals (two, and the segment the cut falls
        in: about ``3 x wal_checkpoint_mb``), and a restart replays them.

        The log is cut only once the storage's checkpoint is durable. While it runs, a
        probe measures how long the event loop went without a turn (:attr:`stats`).
        """
        s = self._state
        wal = s.wal
        if wal is None and not s.storage.checkpoints_without_log:
            return
        started = time.monotonic()
        async with LoopStalls() as stalls:
            if wal is not None:
                interval = wal.bytes_since_checkpoint
                await wal.rotate()
                self._new_interval(interval, started)
            oldest = self._oldest_queued_seq()
            covered = (oldest - 1) if oldest is not None else s.seq
            upto = s.storage.cut(covered, self.horizon, full=full, logged=wal is not None)
            between = self._between_steps if not full else None
            written = await s.storage.checkpoint(s, covered, upto, between)
            self.horizon = covered
            if wal is not None:
                await wal.truncate(upto)
        self._count(time.monotonic() - started, written, stalls.longest_s)

    def _new_interval(self, interval: int, now: float) -> None:
        """A checkpoint starts a new interval of the log: the one that ended had
        ``interval`` bytes (its growth rate is kept for :meth:`due`)."""
        elapsed = now - self._interval_started
        if elapsed > 0 and interval:
            self._growth_bytes_s = interval / elapsed
        self._previous_interval = interval
        self._interval_started = now

    def _count(self, seconds: float, written: int, stall_s: float) -> None:
        stats = self.stats
        stats.checkpoints += 1
        stats.seconds_total += seconds
        stats.last_seconds = seconds
        stats.longest_seconds = max(stats.longest_seconds, seconds)
        stats.bytes_total += written
        stats.last_bytes = written
        stats.last_loop_stall_s = stall_s
        stats.longest_loop_stall_s = max(stats.longest_loop_stall_s, stall_s)

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
