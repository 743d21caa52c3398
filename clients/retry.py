"""When and how long the client waits before trying a request again.

The client retries a request only when doing so cannot change what the server ends up
holding:

* the connection was never made (``ConnectError``, ``ConnectTimeout``, ``PoolTimeout``): the
  server never saw the request, so every call is retried, ``sample`` included;
* ``503 overloaded``: the contract says nothing was accepted, so every call is retried, after
  the answer's ``Retry-After`` when it has one;
* the connection broke after the request was sent, a read timed out, or ``503 unavailable``:
  the server may have acted, so only *idempotent* calls are retried. Those are the reads
  (``get``, ``get_many``, ``describe_table``, ``list_tables``), the table calls
  (``create_table`` is a PUT of a config, ``drop_table`` a DELETE) and the writes whose effect
  does not depend on how often they are applied: ``push`` (a push replaces the key's value
  and priority), ``delete`` and ``update_priorities`` (sets, not increments). ``sample`` is
  not: a repeated sample counts ``times_sampled`` twice and may evict items.

Waits grow exponentially with "equal jitter": attempt ``n`` (from 0) waits a uniformly drawn
time in ``[d / 2, d]`` where ``d = min(max_backoff_s, backoff_s * 2 ** n)``, or at least the
server's ``Retry-After``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = ["RetryPolicy", "parse_retry_after"]


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How many times to retry and how long to wait in between.

    Attributes:
        retries: Retries after the first attempt (0 disables retrying).
        backoff_s: The first wait's upper bound, in seconds.
        max_backoff_s: The cap on any backoff wait (a server's ``Retry-After`` may exceed it).
    """

    retries: int = 3
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    _random: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries ({self.retries}) must be >= 0")
        if self.backoff_s < 0:
            raise ValueError(f"backoff_s ({self.backoff_s}) must be >= 0")
        if self.max_backoff_s < self.backoff_s:
            raise ValueError(
                f"max_backoff_s ({self.max_backoff_s}) must be >= backoff_s ({self.backoff_s})"
            )

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0 for the first retry).

        Args:
            attempt: How many retries came before this one.
            retry_after: The server's ``Retry-After`` in seconds, if it sent one.

        Returns:
            The wait in seconds: jittered backoff, but never less than ``retry_after``.
        """
        ceiling = min(self.max_backoff_s, self.backoff_s * 2.0**attempt)
        wait = self._random.uniform(ceiling / 2, ceiling)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return wait


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header: delta-seconds (fractions accepted) or an HTTP date.

    Args:
        value: The header's value, or None when absent.
        now: The current time, for HTTP dates (defaults to now, in UTC).

    Returns:
        The non-negative wait in seconds, or None when absent or unreadable.
    """
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
