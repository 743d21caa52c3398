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

Where the log is cut (:meth:`Checkpointer.checkpoint`): at the position the previous
checkpoint covered, or lower, down to the oldest value only the cache and the log hold,
as long as the log kept takes at most :data:`KEEP_FRACTION` of the bound to replay (and
at most twice the cap: the log holds three intervals at most, as before). In a
bounded table that turns over within that much log (a FIFO table fed new keys), such a
checkpoint writes no values at all: each one would be deleted again soon after. While
that holds, intervals are shorter (the bound's other quarter), so that the cut, which
drops whole segments of the log (one per interval), can fall close below that value.
"""

from __future__ import annotations

import time
from collections import deque
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
#: The share of the recovery bound the log a checkpoint keeps may take to replay: the
#: rest is for the interval that follows (see :meth:`Checkpointer.due`).
KEEP_FRACTION = 0.75


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
        self._interval_started = time.monotonic()
        self._growth_bytes_s = 0.0  # the log's growth, over the last interval
        # The log's segments, one per interval (a checkpoint rotates it): the last LSN of
        # each one the log keeps and the bytes logged through its end; and the bytes
        # logged through the end of the last one cut (which the log no longer holds).
        self._segments: deque[tuple[int, int]] = deque()
        self._logged = 0
        self._cut_bytes = 0
        #: The log position the log was last cut at (None: where the start found it).
        self._cut: int | None = None
        self._cut_lsn: int | None = None  # the last LSN of the last segment cut
        #: A shorter interval while the log holds a table that turns over (see _lower_cut).
        self._turnover_interval = 0

    def due(self, wal: WriteAheadLog) -> bool:
        """Whether the log calls for a checkpoint now (see the module's docstring).

        A restart replays the log the last cut kept (the last interval's log at least,
        see :meth:`checkpoint`) and this interval's, which grows while the checkpoint
        runs. An interval is counted as at least as long as the one before it: it is the
        previous one at the next checkpoint. While the log holds a table that turns over,
        an interval ends sooner, at the bound's share the log kept leaves (see
        :meth:`_lower_cut`).
        """
        since = wal.bytes_since_checkpoint
        if since > self._cap_bytes:
            return True
        stats = self.stats
        elapsed = time.monotonic() - self._interval_started
        growth = max(self._growth_bytes_s, since / elapsed if elapsed > 0 else 0.0)
        kept = self._logged - self._cut_bytes
        stats.replay_bytes = kept + since
        if not stats.recovery_bound_s or since < _LEAST_INTERVAL_BYTES:
            return False
        if self._turnover_interval and since > self._turnover_interval:
            return True
        # this interval becomes the previous one of the next checkpoint, which a restart
        # replays too: it may take half the bound at most (the first one, with no
        # previous interval, would otherwise take it all, and the next twice as much)
        ahead = max(kept, since) + since + growth * stats.last_seconds
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

    async def checkpoint(self, *, full: bool = False, spare_values: bool = False) -> None:
        """Make what is applied durable without the log, then drop the log it covers.

        The storage decides how far (:meth:`~rlreplay.app.writer.storage.Storage.cut`): memory
        mode writes every table to its checkpoint file; hybrid and disk modes, with the log
        on and unless ``full``, write only values logged before the previous checkpoint, so
        the log then holds up to about three intervals (two, and the segment the cut falls
        in: about ``3 x wal_checkpoint_mb``), and a restart replays them. With
        ``spare_values`` (the checkpoints the cadence calls for) and a recovery bound, the
        cut goes lower still when that spares values (:meth:`_lower_cut`).

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
                # read after the rotation: a segment's last LSN counted high at worst,
                # which only makes the log kept look longer than it is
                self._new_interval(interval, started, last_lsn=wal.next_lsn - 1)
            oldest = self._oldest_queued_seq()
            covered = (oldest - 1) if oldest is not None else s.seq
            upto = s.storage.cut(covered, self.horizon, full=full, logged=wal is not None)
            if wal is not None and spare_values and not full:
                upto = self._lower_cut(upto, s.storage.first_unwritten(s))
            between = self._between_steps if not full else None
            written = await s.storage.checkpoint(s, covered, upto, between)
            self.horizon = covered
            if wal is not None:
                await wal.truncate(upto)
                self._truncated(upto)
        self._count(time.monotonic() - started, written, stalls.longest_s)

    def _new_interval(self, interval: int, now: float, *, last_lsn: int | None = None) -> None:
        """A checkpoint starts a new interval of the log: the one that ended had
        ``interval`` bytes (its growth rate is kept for :meth:`due`) in a segment of its
        own, whose records end at ``last_lsn`` (None: not known, never cut)."""
        elapsed = now - self._interval_started
        if elapsed > 0 and interval:
            self._growth_bytes_s = interval / elapsed
        self._logged += interval
        self._segments.append((last_lsn if last_lsn is not None else 2**63, self._logged))
        self._interval_started = now

    def _lower_cut(self, upto: int, first_unwritten: int | None) -> int:
        """Where to cut the log instead of ``upto`` (the previous checkpoint's position):
        lower, down to just before ``first_unwritten`` (the oldest value logged that only
        the cache and the log hold), so the values logged between are left to the log,
        as long as the log then kept would replay within :data:`KEEP_FRACTION` of the
        bound and holds at most twice ``--wal-checkpoint-mb``; else as low as that allows
        (at a segment's end: the log is cut by segment).

        Never below the last cut (the log holds nothing before it)."""
        stats = self.stats
        bound = stats.replay_bytes_s * stats.recovery_bound_s
        # what --wal-checkpoint-mb promises too: the log holds up to three times the cap
        budget = min(bound * KEEP_FRACTION, 2 * self._cap_bytes)
        floor = self._cut if self._cut is not None else self.horizon
        self._turnover_interval = 0
        if not budget or first_unwritten is None:
            return upto
        lowest = max(first_unwritten - 1, floor, 0)
        # A table that turns over within the log kept (its oldest unwritten value well
        # past the log's start, the values since fitting the budget): the log is cut by
        # segment, so shorter intervals, the bound's remaining share, let the cut fall
        # close below that value instead of a whole interval's log below it.
        interval = bound - budget
        since_lowest = self._logged - self._bytes_at(lowest)
        if self._bytes_at(lowest) - self._bytes_at(floor) >= interval / 2 >= 0:
            if since_lowest <= budget:
                self._turnover_interval = int(max(interval, _LEAST_INTERVAL_BYTES))
        if lowest >= upto:
            return upto
        if self._kept_after(lowest) <= budget:
            return lowest
        for last_lsn, _ in self._segments:
            if lowest < last_lsn <= upto and self._kept_after(last_lsn) <= budget:
                return last_lsn
        return upto

    def _kept_after(self, lsn: int) -> int:
        """Bytes of log (through the last rotation) kept by a cut at ``lsn``: every
        segment but those whose records all come at or before it."""
        base = self._cut_bytes
        for last_lsn, logged in self._segments:
            if last_lsn > lsn:
                break
            base = logged
        return self._logged - base

    def _bytes_at(self, lsn: int) -> float:
        """About how many bytes had been logged (through the last rotation) when record
        ``lsn`` was: interpolated within its segment."""
        start_lsn = self._cut_lsn if self._cut_lsn is not None else self.horizon
        start_bytes = self._cut_bytes
        for last_lsn, logged in self._segments:
            if lsn <= last_lsn:
                span = last_lsn - start_lsn
                share = min(1.0, max(0.0, (lsn - start_lsn) / span)) if span > 0 else 1.0
                return start_bytes + share * (logged - start_bytes)
            start_lsn, start_bytes = last_lsn, logged
        return float(self._logged)

    def _truncated(self, lsn: int) -> None:
        """The log was cut at ``lsn``: forget the segments it dropped."""
        segments = self._segments
        while segments and segments[0][0] <= lsn:
            self._cut_lsn, self._cut_bytes = segments.popleft()
        self._cut = lsn

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
