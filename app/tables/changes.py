"""A table's change feed: the recent changes of its selection state, numbered in order.

Followers (the GPU sidecar) keep a copy of a table's selection state (keys, priorities,
insertion times) and apply these changes in order to stay exact. The writer is the only
code that changes a table, so the order it makes the changes in is the feed's order: the
event numbered ``seq`` is the ``seq``-th change since the feed started.

A feed starts the first time someone follows the table (``GET .../changes`` or
``GET .../index``); until then a table has none and its writer pays one ``is None`` test
per batch. It keeps the last ``keep`` events (whole batches, so at most one batch more);
a follower asking for older ones is told :class:`~rlreplay.wire.errors.Gone` and reloads
the whole state from ``/index``. Each feed has a random ``epoch``: a server that restarts,
or a table dropped and created again, starts a new feed with a new epoch, which tells a
follower that the numbers it holds no longer mean anything.
"""

from __future__ import annotations

import asyncio
import bisect
import secrets
from collections.abc import Sequence
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from rlreplay.wire.errors import Gone, ReplayError
from rlreplay.wire.schemas import ChangeEvent

__all__ = ["OP_DELETE", "OP_PRIORITY", "OP_PUT", "ChangeFeed", "ChangeOp"]

ChangeOp = Literal["put", "delete", "priority"]
OP_PUT: Final = "put"
OP_DELETE: Final = "delete"
OP_PRIORITY: Final = "priority"

#: One batch of events: (first seq, op, keys, priorities or None, inserted_at or None).
_Batch = tuple[int, ChangeOp, list[str], list[float] | None, float | None]


class ChangeFeed:
    """A bounded ring of a table's recent changes, with long-poll wake-ups.

    Every method runs on the event loop's thread (the writer appends, routes read), so
    nothing here locks. Appending costs a tuple and a list append per batch of items; the
    per-event objects are built only when a follower reads them.
    """

    def __init__(self, keep: int) -> None:
        """An empty feed holding at most about ``keep`` events.

        Raises:
            ValueError: ``keep`` is below 1.
        """
        if keep < 1:
            raise ValueError(f"keep ({keep}) must be >= 1")
        self.keep = keep
        #: A random number naming this feed; a new feed (restart, table re-created) has another.
        self.epoch = secrets.randbits(52)
        #: The number of the last event (0: none yet).
        self.seq = 0
        self._batches: list[_Batch] = []
        self._firsts: list[int] = []  # first seq of each batch, for bisect
        self._lo = 0  # batches before it are dropped
        self._held = 0  # events in batches from _lo on
        self._wake: asyncio.Future[None] | None = None
        self.closed = False
        self._ended: ReplayError | None = None  # end_waits(): the server stops

    # -- the writer's side ------------------------------------------------------------------

    def put(self, keys: list[str], priorities: npt.NDArray[np.float64], inserted_at: float) -> None:
        """Items put (new or replaced), in the order the writer selected them."""
        self._append(OP_PUT, keys, priorities.tolist(), float(inserted_at))

    def delete(self, keys: list[str]) -> None:
        """Items that left the table (deleted, trimmed by ``max_size``, used up)."""
        self._append(OP_DELETE, keys, None, None)

    def priority(self, keys: list[str], priorities: Sequence[float]) -> None:
        """New priorities of items the table holds."""
        self._append(OP_PRIORITY, keys, [float(p) for p in priorities], None)

    def _append(
        self, op: ChangeOp, keys: list[str], prios: list[float] | None, ts: float | None
    ) -> None:
        if not keys:
            return
        first = self.seq + 1
        self._batches.append((first, op, keys, prios, ts))
        self._firsts.append(first)
        self.seq += len(keys)
        self._held += len(keys)
        self._trim()
        wake = self._wake
        if wake is not None:
            self._wake = None
            if not wake.done():
                wake.set_result(None)

    def _trim(self) -> None:
        batches, lo = self._batches, self._lo
        while self._held - len(batches[lo][2]) >= self.keep:
            self._held -= len(batches[lo][2])
            lo += 1
        if lo > 1024 and 2 * lo > len(batches):
            del batches[:lo], self._firsts[:lo]
            lo = 0
        self._lo = lo

    def close(self) -> None:
        """The table is gone or its writer stopped: wake every long poll now."""
        self.closed = True
        wake, self._wake = self._wake, None
        if wake is not None and not wake.done():
            wake.set_result(None)

    def end_waits(self, error: ReplayError) -> None:
        """The server stops: a long poll with no event to answer, now or later, raises
        ``error`` (a copy each) instead of waiting; the feed itself goes on."""
        self._ended = error
        wake, self._wake = self._wake, None
        if wake is not None and not wake.done():
            wake.set_result(None)

    # -- the followers' side ----------------------------------------------------------------

    @property
    def oldest(self) -> int:
        """The number of the oldest event held (``seq + 1`` when none is)."""
        return self.seq - self._held + 1

    def events(self, since: int, limit: int) -> list[ChangeEvent]:
        """Up to ``limit`` events after event ``since``, oldest first.

        Raises:
            Gone: ``since`` is older than the oldest event held, or newer than the last one
                (numbers of another feed: the server restarted).
        """
        if since > self.seq:
            raise Gone(
                f"since ({since}) is past this feed's last event ({self.seq}): the server "
                "restarted or the table was re-created; reload from /index"
            )
        if since < self.oldest - 1:
            raise Gone(
                f"events after {since} are no longer kept (the oldest kept is "
                f"{self.oldest}; --changes-keep {self.keep}); reload from /index"
            )
        out: list[ChangeEvent] = []
        at = max(self._lo, bisect.bisect_right(self._firsts, since + 1, lo=self._lo) - 1)
        batches = self._batches
        while at < len(batches) and len(out) < limit:
            first, op, keys, prios, ts = batches[at]
            start = max(0, since + 1 - first)
            stop = min(len(keys), start + limit - len(out))
            for i in range(start, stop):
                out.append(
                    ChangeEvent(first + i, op, keys[i], None if prios is None else prios[i], ts)
                )
            at += 1
        return out

    async def wait(self, since: int, timeout_s: float) -> None:
        """Return once an event after ``since`` exists, the feed closes, or ``timeout_s`` passes.

        Raises:
            ReplayError: The error given to :meth:`end_waits`, when no event is there.
        """
        if self.seq > since or self.closed or timeout_s <= 0:
            return
        self._raise_if_ended()
        if self._wake is None or self._wake.done():
            self._wake = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._wake), timeout_s)
        except TimeoutError:
            return
        if self.seq <= since and not self.closed:
            self._raise_if_ended()

    def _raise_if_ended(self) -> None:
        if self._ended is not None:
            raise type(self._ended)(self._ended.message)
