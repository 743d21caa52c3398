"""Rate limiters: when a table lets inserts and samples through (Reverb's model).

A :class:`RateLimiter` counts a table's inserts and samples and answers two questions,
synchronously and without side effects: may ``n`` more inserts go in now, and may ``n``
more samples be taken now? :func:`~rlreplay.app.tables.config.make_rate_limiter` builds one from a
table config's
``rate_limiter`` spec. A :class:`RateGate` wraps it and makes callers wait for a yes.

The cursor (Reverb calls it *diff*) is ``inserts · samples_per_insert - samples``:
every insert moves it up by ``samples_per_insert``, every sample down by 1.

* A sample of ``n`` is allowed when the table holds at least ``min_size_to_sample``
  items and the cursor stays at or above ``min_diff`` after it.
* An insert of ``n`` is allowed while the table, with them, holds no more than
  ``min_size_to_sample`` items (filling up is never blocked), or when the cursor stays
  at or below ``max_diff`` after it.

The kinds of the contract are settings of these four numbers (``e`` is ``error_buffer``):

==========================  =====  ==================  ==============  ==============
kind                        ratio  min_size_to_sample  min_diff        max_diff
==========================  =====  ==================  ==============  ==============
``min_size``                1      ``min_size``        -inf            +inf
none (no limiter)           1      1                   -inf            +inf
``sample_to_insert_ratio``  ``r``  ``m``               ``r·m - e``     ``r·m + e``
``queue``                   1      1                   0               ``size``
==========================  =====  ==================  ==============  ==============

How a table uses a gate (all on the event loop's thread)::

    gate = RateGate(make_rate_limiter(config.rate_limiter), size_fn=table.visible_size)
    for warning in gate.problems(config.max_size, config.max_times_sampled): log(warning)
    if gate.limited:                        # False for "no limiter": skip the gate entirely
        await gate.acquire_insert(n, timeout_s)   # then make the n items visible, no await between
        await gate.acquire_sample(n, timeout_s)   # then draw the n picks

* The table's size, for the rules above, is ``size_fn()`` when given (the size a reader
  sees, pending ops included). Without ``size_fn`` it is ``inserts - deletes``, and the
  table must then call ``gate.on_delete(k)`` for every item that leaves (a delete, an
  eviction, ``max_times_sampled``, the old item of a replaced key). With ``size_fn``,
  call ``gate.notify()`` after deletes instead, so waiters re-check.
* Each pushed item counts as one insert, a replaced key included.
* ``gate.refund_insert(n)`` / ``refund_sample(n)`` take back counted calls that then did
  not happen (say the write queue refused the push).
* ``gate.close(error)`` when the table is dropped: every waiter raises ``error``.

Batches: an insert batch is admitted whole (it becomes visible at once, so it must fit
at once); a batch that could never fit, such as a push of 300 items into a ``queue`` of
size 256, fails at once with ``ValidationFailed`` rather than waiting out its deadline.
A sample batch is admitted item by item, as in Reverb: the gate takes as many samples as
the limiter allows, counts them, and waits for more, so a batch larger than the
limiter's slack (``batch_size`` 256 with ``error_buffer`` 100) still goes through as
inserts arrive. If the deadline passes, or the caller is cancelled, the samples already
taken are given back before ``DeadlineExceeded`` is raised, so the counts only reflect
samples that happened.

Waiting: every change the gate sees (an insert or sample counted, a delete, a refund,
``notify``) wakes every waiter, which re-checks its condition; nothing polls. The
wake-up is a broadcast ``asyncio.Event``, replaced on each change, rather than an
``asyncio.Condition``, because ``on_delete`` and ``notify`` must be callable from plain
synchronous code and ``Condition.notify`` requires holding its lock.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from rlreplay.wire.errors import DeadlineExceeded, ReplayError, ValidationFailed


@dataclass(slots=True)
class RateLimiter:
    """Reverb's rate limiter: the counts of a table's inserts, samples and deletes, and bounds.

    Attributes:
        kind: the ``type`` of the spec it was made from, for messages.
        samples_per_insert: how far each insert moves the cursor up.
        min_size_to_sample: items the table must hold before any sample.
        min_diff: the lowest the cursor may go by sampling.
        max_diff: the highest the cursor may go by inserting (once past the minimum size).
        inserts: inserts counted so far.
        samples: samples counted so far.
        deletes: items that left the table so far.
    """

    kind: str
    samples_per_insert: float
    min_size_to_sample: int
    min_diff: float
    max_diff: float
    inserts: int = field(default=0)
    samples: int = field(default=0)
    deletes: int = field(default=0)

    def __post_init__(self) -> None:
        """Checks the bounds eagerly, naming the bad value."""
        if not self.samples_per_insert > 0:
            raise ValueError(f"samples_per_insert ({self.samples_per_insert!r}) must be > 0")
        if self.min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample ({self.min_size_to_sample!r}) must be >= 1")
        if not self.min_diff <= self.max_diff:
            raise ValueError(
                f"min_diff ({self.min_diff!r}) must be <= max_diff ({self.max_diff!r})"
            )

    @property
    def size(self) -> int:
        """Items in the table as the limiter counts them: inserts minus deletes."""
        return self.inserts - self.deletes

    @property
    def cursor(self) -> float:
        """``inserts · samples_per_insert - samples``."""
        return self.inserts * self.samples_per_insert - self.samples

    def can_insert(self, n: int, size: int | None = None) -> bool:
        """Whether ``n`` inserts, taken together, may go in now.

        Args:
            n: the inserts.
            size: the table's size, when the table knows it better than ``inserts - deletes``.
        """
        if (self.size if size is None else size) + n <= self.min_size_to_sample:
            return True
        return (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff

    def can_sample(self, n: int, size: int | None = None) -> bool:
        """Whether ``n`` samples, taken together, may be taken now (``size`` as for inserts)."""
        if (self.size if size is None else size) < self.min_size_to_sample:
            return False
        return self.cursor - n >= self.min_diff

    def samples_allowed(self, wanted: int, size: int | None = None) -> int:
        """The most samples, up to ``wanted``, that may be taken now (``size`` as for inserts)."""
        if wanted <= 0 or not self.can_sample(1, size):
            return 0
        if self.can_sample(wanted, size):
            return wanted
        allowed = min(wanted - 1, max(1, math.floor(self.cursor - self.min_diff)))
        while allowed > 1 and not self.can_sample(allowed, size):
            allowed -= 1
        while allowed + 1 < wanted and self.can_sample(allowed + 1, size):
            allowed += 1
        return allowed

    def insert_can_ever_pass(self, n: int) -> bool:
        """False when a batch of ``n`` inserts could not pass however the table changes.

        Samples bring the cursor down to about ``min_diff`` at best, and deletes the size
        down to 0, so a batch passes some day only if it fits within the minimum size or
        within ``max_diff`` from the lowest cursor it can reach. (True is optimistic: the
        other clients must still make that state happen.)
        """
        if n <= self.min_size_to_sample:
            return True
        lowest = min(self.cursor, self.min_diff)
        return lowest + n * self.samples_per_insert <= self.max_diff

    def record_inserts(self, n: int) -> None:
        """Counts ``n`` inserts (negative to take back ones that did not happen)."""
        self.inserts += n

    def record_samples(self, n: int) -> None:
        """Counts ``n`` samples (negative to take back ones that did not happen)."""
        self.samples += n

    def record_deletes(self, n: int) -> None:
        """Counts ``n`` items that left the table."""
        self.deletes += n

    def problems(self, max_size: int | None, max_times_sampled: int) -> list[str]:
        """Settings that would stall the table or defeat the limiter, for a warning at creation.

        Args:
            max_size: the table's capacity, None when unbounded.
            max_times_sampled: the table's limit on samples per item, 0 when unlimited.

        Returns:
            One sentence per problem found; empty when the configuration is sound.
        """
        found: list[str] = []
        if max_size is not None and self.min_size_to_sample > max_size:
            found.append(
                f"{self.kind}: min_size_to_sample ({self.min_size_to_sample}) > max_size "
                f"({max_size}): the table never holds enough items, so samples always wait"
            )
        if self.kind == "sample_to_insert_ratio":
            spare = (self.max_diff - self.min_diff) / 2
            if spare < max(1.0, self.samples_per_insert):
                found.append(
                    f"sample_to_insert_ratio: error_buffer ({spare:g}) < max(1, "
                    f"samples_per_insert) ({max(1.0, self.samples_per_insert):g}): inserts and "
                    "samples can both be blocked at once, and the table stalls"
                )
            if 0 < max_times_sampled < self.samples_per_insert:
                found.append(
                    f"sample_to_insert_ratio: samples_per_insert ({self.samples_per_insert:g}) > "
                    f"max_times_sampled ({max_times_sampled}): items are deleted before the "
                    "ratio is reached, so the table hovers at min_size_to_sample"
                )
        if self.kind == "queue" and max_size is not None and self.max_diff > max_size:
            found.append(
                f"queue: size ({self.max_diff:g}) > max_size ({max_size}): the remover evicts "
                "items before they are sampled"
            )
        return found

    def state_dict(self) -> dict[str, int]:
        """The counts, for a checkpoint (the bounds come from the table config)."""
        return {"inserts": self.inserts, "samples": self.samples, "deletes": self.deletes}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restores the counts of :meth:`state_dict`."""
        self.inserts = int(state["inserts"])
        self.samples = int(state["samples"])
        self.deletes = int(state["deletes"])


class RateGate:
    """A table's rate limiter plus the waiting room for the calls it holds back.

    Inserts and samples that the limiter does not allow yet wait here (without polling)
    until a change makes them allowed, their deadline passes, or the gate is closed.
    See the module docstring for how a table drives it.
    """

    def __init__(self, limiter: RateLimiter, *, size_fn: Callable[[], int] | None = None) -> None:
        """Creates a gate with nobody waiting.

        Args:
            limiter: the limiter whose counts this gate keeps; see
            :func:`~rlreplay.app.tables.config.make_rate_limiter`.
            size_fn: the table's current size, as readers see it; without it the size is
                the limiter's ``inserts - deletes``.
        """
        self._limiter = limiter
        self._size_fn = size_fn
        self._changed = asyncio.Event()
        self._closed: ReplayError | None = None
        self._ended: ReplayError | None = None  # end_waits(): the server stops

    @property
    def limited(self) -> bool:
        """False when the table has no limiter (calls may skip the gate and keep no counts)."""
        return self._limiter.kind != "none"

    def _size(self) -> int | None:
        return None if self._size_fn is None else self._size_fn()

    @property
    def limiter(self) -> RateLimiter:
        """The limiter and its counts (read them for stats; change them through the gate)."""
        return self._limiter

    def problems(self, max_size: int | None, max_times_sampled: int) -> list[str]:
        """Configurations that stall or defeat the limiter; see :meth:`RateLimiter.problems`."""
        return self._limiter.problems(max_size, max_times_sampled)

    async def acquire_insert(self, n: int, timeout_s: float | None) -> None:
        """Waits until ``n`` inserts may go in together, then counts them.

        Args:
            n: items in the push (> 0).
            timeout_s: how long to wait at most; None waits as long as it takes.

        Raises:
            ValidationFailed: no state of the table would ever let a batch of ``n`` in.
            DeadlineExceeded: the limiter did not allow it within ``timeout_s``.
            ReplayError: the error given to :meth:`close`.
        """
        limiter = self._limiter
        self._raise_if_closed()
        if not limiter.insert_can_ever_pass(n):
            raise ValidationFailed(
                f"a push of {n} items can never pass the table's {limiter.kind} rate limiter "
                f"(max_diff {limiter.max_diff:g}); push fewer items per request"
            )
        try:
            async with asyncio.timeout(timeout_s):
                while not limiter.can_insert(n, self._size()):
                    await self._wait()
        except TimeoutError:
            raise DeadlineExceeded(
                f"rate limiter ({limiter.kind}) did not allow {n} inserts within {timeout_s:g} s"
            ) from None
        limiter.record_inserts(n)
        self.notify()

    async def acquire_sample(self, n: int, timeout_s: float | None) -> None:
        """Waits until ``n`` samples have been allowed, taking them as they are allowed.

        Args:
            n: draws in the batch (> 0).
            timeout_s: how long to wait at most; None waits as long as it takes.

        Raises:
            DeadlineExceeded: not all ``n`` were allowed within ``timeout_s``; any taken
                are given back first.
            ReplayError: the error given to :meth:`close`.
        """
        limiter = self._limiter
        self._raise_if_closed()
        taken = 0
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    allowed = limiter.samples_allowed(n - taken, self._size())
                    if allowed:
                        limiter.record_samples(allowed)
                        taken += allowed
                        self.notify()
                    if taken == n:
                        return
                    await self._wait()
        except TimeoutError:
            self.refund_sample(taken)
            raise DeadlineExceeded(
                f"rate limiter ({limiter.kind}) allowed {taken} of {n} samples "
                f"within {timeout_s:g} s"
            ) from None
        except BaseException:
            self.refund_sample(taken)
            raise

    def on_delete(self, n: int) -> None:
        """Counts ``n`` items that left the table, and wakes the waiters."""
        if n:
            self._limiter.record_deletes(n)
            self.notify()

    def refund_insert(self, n: int) -> None:
        """Takes back ``n`` inserts counted by :meth:`acquire_insert` that did not happen."""
        if n:
            self._limiter.record_inserts(-n)
            self.notify()

    def refund_sample(self, n: int) -> None:
        """Takes back ``n`` samples counted by :meth:`acquire_sample` that did not happen."""
        if n:
            self._limiter.record_samples(-n)
            self.notify()

    def notify(self) -> None:
        """Wakes every waiter to re-check its condition (after any change to the counts)."""
        self._changed.set()
        self._changed = asyncio.Event()

    def close(self, error: ReplayError) -> None:
        """Fails every current and future waiter with ``error`` (the table is going away)."""
        self._closed = error
        self.notify()

    def end_waits(self, error: ReplayError) -> None:
        """The server stops: a call that would wait, now or later, raises ``error``
        instead; one the limiter allows still goes through."""
        self._ended = error
        self.notify()

    def _raise_if_closed(self) -> None:
        if self._closed is not None:
            raise type(self._closed)(self._closed.message)

    def _raise_if_ended(self) -> None:
        self._raise_if_closed()
        if self._ended is not None:
            raise type(self._ended)(self._ended.message)

    async def _wait(self) -> None:
        """Blocks until the next change; raises the close error if the gate is closed, and
        the error given to :meth:`end_waits` once the server stops."""
        self._raise_if_ended()
        await self._changed.wait()
        self._raise_if_ended()
