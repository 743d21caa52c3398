"""Records lost in failed log flushes: their writes are refused for good.

A flush that fails loses every record in it; those LSNs are remembered as ranges, so that
whoever waits for one of them is told so, even after later records are durable.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

_KEPT = 1024  # ranges remembered (adjacent ones merge)


@dataclass(slots=True)
class Refusal:
    """LSNs ``first`` to ``last`` were lost in a failed flush: their writes are refused."""

    first: int
    last: int
    error: OSError


class Refusals:
    """The ranges of refused LSNs, ordered, the newest last."""

    def __init__(self) -> None:
        self._ranges: deque[Refusal] = deque(maxlen=_KEPT)

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def find(self, lsn: int) -> Refusal | None:
        """The failed flush that lost record ``lsn``, if one did."""
        for refusal in reversed(self._ranges):
            if refusal.first <= lsn <= refusal.last:
                return refusal
            if refusal.last < lsn:
                return None
        return None

    def add(self, first: int, last: int, error: OSError) -> None:
        """Records ``first``..``last`` were lost."""
        prev = self._ranges[-1] if self._ranges else None
        if prev is not None and prev.last + 1 == first:
            prev.last = last
            prev.error = error
        elif prev is None or prev.last < first:
            self._ranges.append(Refusal(first, last, error))
        else:  # below the newest range (never in practice): keep them ordered for find()
            ranges = sorted([*self._ranges, Refusal(first, last, error)], key=lambda r: r.first)
            self._ranges = deque(ranges[-_KEPT:], maxlen=_KEPT)
