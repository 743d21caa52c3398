"""What a start does when the data on disk cannot give back everything that was answered.

Recovery reports each thing it finds missing or damaged here, with one sentence naming the
file, the bytes or the records. By default the start stops on the first
(:class:`~rlreplay.app.log.framing.LogRecoveryError`, exit status 3), with the ways on. Two
settings let it go on, logging what is dropped and counting it
(``rlreplay_recovery_data_lost_total{kind}``):

- ``--wal-recovery point-in-time``: damage in the log (a gap, a damaged segment, a record
  that cannot be applied) ends replay there, as RocksDB's point-in-time recovery does: the
  tables are as they were at that point of the log, and later segments are set aside as
  ``*.skipped``. A missing or damaged checkpoint still stops the start.
- ``--accept-data-loss``: any damage. A damaged checkpoint gives back its whole sections; the
  log is replayed past holes and damaged bytes, every whole record that is left (with
  ``point-in-time`` too, the log is replayed up to its first damage instead).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Literal

from rlreplay.app.log.framing import LogRecoveryError

log = logging.getLogger("rlreplay.app.engine.engine")

#: How to go on, by what was found.
_HOW = {
    "log": (
        "Put the file back if you have it; or start with --wal-recovery point-in-time to "
        "recover up to the damage (later segments are set aside as *.skipped), or with "
        "--accept-data-loss to replay every whole record that is left"
    ),
    "checkpoint_missing": (
        "Put the checkpoint back (or restore a snapshot: --restore <id> --restore-replace); or "
        "start with --accept-data-loss to replay what the log still holds"
    ),
    "checkpoint_damaged": (
        "Put back a whole copy (or restore a snapshot: --restore <id> --restore-replace); or "
        "start with --accept-data-loss to load what is whole in it and replay the log on top"
    ),
}


class DataLoss:
    """The policy of one start towards missing and damaged data, and what it went past.

    Args:
        accept: ``--accept-data-loss``: go on past any damage.
        wal_recovery: ``--wal-recovery``: ``point-in-time`` goes on past damage in the log,
            replaying up to it.
        checkpoint: The checkpoint, as messages name it ("the checkpoint in <folder>").
    """

    def __init__(
        self,
        *,
        accept: bool = False,
        wal_recovery: Literal["strict", "point-in-time"] = "strict",
        checkpoint: str = "the checkpoint",
    ) -> None:
        self.accept = accept
        self.point_in_time = wal_recovery == "point-in-time"
        self.checkpoint = checkpoint
        #: What was gone past, by kind (the metric's counts).
        self.counts: Counter[str] = Counter()

    @property
    def log_policy(self) -> Literal["strict", "prefix", "salvage"]:
        """What replay does at damage in the log: stop the start, end there, or go on."""
        if self.point_in_time:
            return "prefix"
        return "salvage" if self.accept else "strict"

    @property
    def lost(self) -> bool:
        """Whether the start went past anything."""
        return bool(self.counts)

    def found(self, kind: str, problem: str) -> None:
        """``problem`` (one sentence, naming what is missing or damaged) was found.

        Raises:
            LogRecoveryError: The settings do not let the start go on past it: the message
                is ``problem`` and how to go on.
        """
        in_log = kind.startswith("log")
        if not (self.accept or (in_log and self.point_in_time)):
            how = _HOW["log" if in_log else kind]
            raise LogRecoveryError(f"{problem}. {how}.", kind=kind)
        self.counts[kind] += 1
        flag = "--accept-data-loss" if self.accept and not in_log else self._log_flag()
        log.error("data lost: %s; the start goes on without it (%s)", problem, flag)

    def _log_flag(self) -> str:
        return "--wal-recovery point-in-time" if self.point_in_time else "--accept-data-loss"
