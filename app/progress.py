"""Progress of long work (a restore, the log's replay, a snapshot upload, an export), shown
as it goes: a ``tqdm`` bar when stderr is a terminal, else a log line every few seconds with
the rate and the time left.

The time left is an estimate a person can trust: none until the work has run
:data:`ESTIMATE_AFTER_S` and done :data:`ESTIMATE_AFTER_RATIO` of its total, and the rate
behind it is smoothed (an exponential average of the rates between samples at least
:data:`SAMPLE_S` apart), so one quick file or one slow one does not swing it.

:class:`RecoveryProgress` holds the phases of a start-up (``restore``, ``replay``) for the
``rlreplay_recovery_*`` series of ``/metrics``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = [
    "ESTIMATE_AFTER_RATIO",
    "ESTIMATE_AFTER_S",
    "SAMPLE_S",
    "Progress",
    "RecoveryProgress",
    "format_amount",
]

#: No time-left estimate before the work has run this long...
ESTIMATE_AFTER_S = 2.0
#: ... and done this share of its total.
ESTIMATE_AFTER_RATIO = 0.02
#: Rate samples are at least this far apart.
SAMPLE_S = 0.5
#: Weight of the newest sample in the smoothed rate.
_SMOOTHING = 0.3


def format_amount(amount: float, unit: str) -> str:
    """``amount`` for a person: bytes in kB/MB/GB (powers of 1000), other units as counts."""
    if unit != "B":
        return f"{amount:,.0f} {unit}"
    for scale, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if amount >= scale:
            return f"{amount / scale:.1f} {name}"
    return f"{amount:.0f} B"


class Progress:
    """How far one piece of work has come, reported while it runs.

    Safe to update from one thread while another reads it (the gauges): the figures are
    floats written whole. Call :meth:`close` when the work ends (it logs the summary).

    Args:
        what: What the work is, the start of every line (``"restore"``).
        total: The amount of work (bytes, records...); None while unknown.
        log: Where the lines go when there is no bar.
        unit: ``"B"`` for bytes (shown in kB/MB/GB), else the name of a count (``"records"``).
        every_s: Seconds between log lines.
        bar: Show a ``tqdm`` bar instead of log lines; None: when ``stream`` is a terminal.
        stream: Where the bar goes (stderr when None).
        clock: Seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        what: str,
        total: float | None,
        *,
        log: logging.Logger,
        unit: str = "B",
        every_s: float = 5.0,
        bar: bool | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s ({every_s}) must be > 0")
        self.what = what
        self.unit = unit
        self.total = total
        self.done: float = 0  # an int while callers count in ints, as a bar shows them
        self.closed = False
        self._log = log
        self._every_s = every_s
        self._clock = clock
        self.started = clock()
        self._last_line = self.started
        self._sample = (self.started, 0.0)
        self._rate: float | None = None
        self._lock = threading.Lock()
        out = sys.stderr if stream is None else stream
        self._bar: Any = None
        if bar if bar is not None else _is_terminal(out):
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc=what,
                unit=unit,
                unit_scale=unit == "B",
                unit_divisor=1000,
                file=out,
                dynamic_ncols=True,
                leave=True,
            )

    @property
    def ratio(self) -> float | None:
        """Share of the total done, 0 to 1; None while the total is unknown."""
        if self.total is None:
            return None
        return 1.0 if self.total <= 0 else min(1.0, self.done / self.total)

    @property
    def elapsed_s(self) -> float:
        """Seconds since the work started."""
        return self._clock() - self.started

    @property
    def rate(self) -> float | None:
        """Units per second, smoothed; None before the first sample."""
        return self._rate

    def seconds_left(self) -> float | None:
        """The time left at the smoothed rate; None until an estimate can be trusted."""
        ratio = self.ratio
        if ratio is None or self._rate is None or self._rate <= 0:
            return None
        if ratio >= 1.0:
            return 0.0
        if self.elapsed_s < ESTIMATE_AFTER_S or ratio < ESTIMATE_AFTER_RATIO:
            return None
        assert self.total is not None
        return (self.total - self.done) / self._rate

    def set_total(self, total: float) -> None:
        """The total, once known (or when it changes)."""
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def update(self, amount: float) -> None:
        """``amount`` more is done."""
        self.advance_to(self.done + amount)

    def advance_to(self, done: float) -> None:
        """``done`` is done in all (it only goes up)."""
        with self._lock:
            step = done - self.done
            if step <= 0:
                return
            self.done = done
            now = self._clock()
            self._take_sample(now)
            if self._bar is not None:
                self._bar.update(step)
            elif now - self._last_line >= self._every_s:
                self._last_line = now
                self._log.info("%s: %s", self.what, self.describe())

    def _take_sample(self, now: float) -> None:
        at, done_then = self._sample
        if now - at < SAMPLE_S:
            return
        rate = (self.done - done_then) / (now - at)
        self._rate = (
            rate if self._rate is None else (1 - _SMOOTHING) * self._rate + _SMOOTHING * rate
        )
        self._sample = (now, self.done)

    def describe(self) -> str:
        """How far the work is, e.g. ``45% (150.0 MB of 340.0 MB), 12.0 MB/s, about 16 s left``."""
        done = format_amount(self.done, self.unit)
        ratio = self.ratio
        if ratio is None or self.total is None:
            text = done
        elif self.unit == "B":
            text = f"{ratio:.0%} ({done} of {format_amount(self.total, self.unit)})"
        else:
            text = f"{ratio:.0%} ({self.done:,.0f} of {format_amount(self.total, self.unit)})"
        if self._rate is not None:
            text += f", {format_amount(self._rate, self.unit)}/s"
        left = self.seconds_left()
        return text + (f", about {left:.0f} s left" if left is not None else "")

    def close(self, *, summary: bool = True) -> None:
        """The work ended: close the bar and log the summary line (unless not ``summary``,
        or there was nothing to do); idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._bar is not None:
            self._bar.close()
        if not summary or self.total == 0:
            return
        took = self.elapsed_s
        rate = f" ({format_amount(self.done / took, self.unit)}/s)" if took > 0.05 else ""
        self._log.info(
            "%s: done, %s in %.1f s%s", self.what, format_amount(self.done, self.unit), took, rate
        )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self.close(summary=exc is None)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class RecoveryProgress:
    """The phases of a start-up and how far each has come, for ``/metrics``.

    A phase appears once it starts (``restore`` only with ``--restore``); its progress stays
    at 1 once done.
    """

    def __init__(self, *, every_s: float = 5.0) -> None:
        """No phase yet; each will log a line every ``every_s`` seconds (without a bar)."""
        self.every_s = every_s
        self.phases: dict[str, Progress] = {}

    def start(self, phase: str, total: float | None, *, log: logging.Logger, unit: str) -> Progress:
        """Begin ``phase`` (a fresh :class:`Progress`, described as ``phase``)."""
        progress = Progress(phase, total, log=log, unit=unit, every_s=self.every_s)
        self.phases[phase] = progress
        return progress
