"""Progress of a transfer, in the terms an operator reads in a log line."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rlreplay.app.progress import ESTIMATE_AFTER_RATIO, ESTIMATE_AFTER_S

__all__ = ["ProgressInfo", "ProgressTracker"]


@dataclass(frozen=True)
class ProgressInfo:
    """How far a download has come.

    Attributes:
        files_done: Files fully transferred and verified.
        files_total: Files the transfer moves in all.
        bytes_done: Bytes of the finished files.
        bytes_total: Bytes the transfer moves in all.
        elapsed_s: Seconds since the transfer started.
    """

    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    elapsed_s: float

    @property
    def rate_mb_s(self) -> float:
        """Average rate so far, in MB/s (10**6 bytes); 0 before any time has passed."""
        return self.bytes_done / 1e6 / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def seconds_left(self) -> float | None:
        """Time left at the average rate so far; ``None`` until the transfer has run
        :data:`~rlreplay.app.progress.ESTIMATE_AFTER_S` and moved
        :data:`~rlreplay.app.progress.ESTIMATE_AFTER_RATIO` of its bytes: the first file
        of a transfer says little about the rest."""
        if self.bytes_done >= self.bytes_total:
            return 0.0
        if (
            self.elapsed_s < ESTIMATE_AFTER_S
            or self.bytes_done < ESTIMATE_AFTER_RATIO * self.bytes_total
        ):
            return None
        return (self.bytes_total - self.bytes_done) * self.elapsed_s / self.bytes_done

    def __str__(self) -> str:
        left = self.seconds_left
        return (
            f"{self.files_done}/{self.files_total} files, "
            f"{self.bytes_done / 1e6:.1f}/{self.bytes_total / 1e6:.1f} MB, "
            f"{self.rate_mb_s:.1f} MB/s, "
            + ("time left unknown" if left is None else f"{left:.0f} s left")
        )


@dataclass
class ProgressTracker:
    """Counts finished files of one transfer and reports a :class:`ProgressInfo` for each.

    Used from the thread that drives the transfer only, so it needs no lock.
    """

    files_total: int
    bytes_total: int
    files_done: int = 0
    bytes_done: int = 0
    started: float = field(default_factory=time.monotonic)

    def file_done(self, size: int) -> ProgressInfo:
        """Count one more finished file of ``size`` bytes; the progress after it."""
        self.files_done += 1
        self.bytes_done += size
        return ProgressInfo(
            files_done=self.files_done,
            files_total=self.files_total,
            bytes_done=self.bytes_done,
            bytes_total=self.bytes_total,
            elapsed_s=time.monotonic() - self.started,
        )
