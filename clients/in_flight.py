"""The pipelining that both writers hold: requests sent as tasks the pipeline owns, a bounded
number in flight, each after the ones in flight that share a key with it.

:class:`~rlreplay.clients.writer.Writer` queues batches of items, keyed by their items' keys;
:class:`~rlreplay.clients.episode_writer.EpisodeWriter` queues appends, keyed by their
episode. A queued job waits while a job in flight holds one of its keys, so what is written
to one key (or episode) arrives in the order it was queued; at most ``max_in_flight`` jobs are
in flight, and the caller waiting for its job to be sent is the writers' backpressure.

A job whose send fails does not stop the others: its error is kept and raised once, by the
next call that checks (:meth:`InFlight.raise_error`) or by :meth:`InFlight.flush`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["InFlight", "count_argument"]

J = TypeVar("J")


def count_argument(name: str, count: int) -> int:
    """``count`` when it is an int of at least 1 (a ``bool`` is not).

    Raises:
        TypeError: Not an int.
        ValueError: Below 1.
    """
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"{name} ({count!r}) must be an int")
    if count < 1:
        raise ValueError(f"{name} ({count}) must be >= 1")
    return count


@dataclass(slots=True)
class _Queued(Generic[J]):
    job: J
    keys: frozenset[str]
    #: True once sent; False when dropped before it was.
    sent: asyncio.Future[bool]


class InFlight(Generic[J]):
    """Jobs sent as tasks it owns, at most ``max_in_flight`` at once, each after every job in
    flight that shares a key with it (see the module).

    Args:
        send: Sends one job; answers how many of its entries the server accepted.
        max_in_flight: Jobs in flight at most (at least 1).
        in_order: True: jobs are sent in the order queued, a waiting job holding back the
            ones behind it. False: a job whose keys are free passes the ones that wait.
        failed: Told of a job whose send raised, before the error is kept (to note what
            was lost on the error, or :meth:`drop` what depended on the job).
        owner: What the messages call the writer ("the writer").
        jobs: What the messages call several jobs ("batches").
    """

    def __init__(
        self,
        send: Callable[[J], Awaitable[int]],
        *,
        max_in_flight: int,
        in_order: bool,
        failed: Callable[[J, Exception], None],
        owner: str,
        jobs: str,
    ) -> None:
        self._send = send
        self._max_in_flight = count_argument("max_in_flight", max_in_flight)
        self._in_order = in_order
        self._failed = failed
        self._owner = owner
        self._jobs = jobs
        self._queued: list[_Queued[J]] = []  # not sent yet, oldest first
        self._in_flight: dict[asyncio.Task[int], frozenset[str]] = {}
        self._errors: list[BaseException] = []
        self._closed = False
        #: Entries the server has accepted so far.
        self.accepted = 0

    @property
    def in_flight(self) -> int:
        """Jobs sent and not answered yet."""
        return len(self._in_flight)

    def queued(self) -> list[J]:
        """The jobs not sent yet, oldest first."""
        return [queued.job for queued in self._queued]

    def queue(self, job: J, keys: frozenset[str]) -> asyncio.Future[bool]:
        """Queue ``job`` and send what may go; the answer turns True once ``job`` is sent,
        False if it is dropped first."""
        queued = _Queued(job, keys, asyncio.get_running_loop().create_future())
        self._queued.append(queued)
        self._send_queued()
        return queued.sent

    def drop(self, which: Callable[[J], bool]) -> None:
        """Drop the queued jobs ``which`` picks: they are not sent."""
        for queued in [q for q in self._queued if which(q.job)]:
            self._queued.remove(queued)
            if not queued.sent.done():
                queued.sent.set_result(False)

    def check_open(self) -> None:
        """Raise RuntimeError once :meth:`close` was called."""
        if self._closed:
            raise RuntimeError(f"{self._owner}'s async with block has exited")

    def raise_error(self) -> None:
        """Raise the oldest error not raised yet, if any (once)."""
        if self._errors:
            raise self._errors.pop(0)

    async def flush(self) -> None:
        """Return once every job queued is answered.

        Raises:
            ReplayError: A job failed (the first error; how many more failed noted).
        """
        # A queued job waits only for jobs in flight, so this drains the queue too.
        while self._in_flight:
            await asyncio.wait(set(self._in_flight))
        if self._errors:
            first, *others = self._errors
            self._errors.clear()
            if others:
                first.add_note(f"{len(others)} more {self._jobs} failed too")
            raise first

    async def close(self, exc: BaseException | None) -> None:
        """The end of the writer's block, which raised ``exc`` (None: it ended normally).

        Flushes when it ended normally. When it raised, sends nothing more (the queued jobs
        are dropped) and waits for the jobs in flight, whose errors give way to the block's.
        When the block (or this flush) was cancelled or interrupted, cancels the jobs in
        flight and returns without waiting for their answers.
        """
        self._closed = True  # first: whatever happens below, later jobs are refused
        if exc is None:
            try:
                await self.flush()
            except BaseException as error:
                if not isinstance(error, Exception):
                    await self._abort(cancel=True)
                raise
        else:
            await self._abort(cancel=not isinstance(exc, Exception))

    def _send_queued(self) -> None:
        """Send the queued jobs, oldest first, whose keys no job in flight holds, while a
        slot is free; called whenever a job is queued or answered."""
        i = 0
        while i < len(self._queued) and len(self._in_flight) < self._max_in_flight:
            queued = self._queued[i]
            if any(queued.keys & keys for keys in self._in_flight.values()):
                if self._in_order:
                    return
                i += 1
                continue
            del self._queued[i]
            task = asyncio.create_task(self._run(queued.job))
            self._in_flight[task] = queued.keys
            task.add_done_callback(self._answered)
            if not queued.sent.done():  # done: its caller was cancelled; it goes anyway
                queued.sent.set_result(True)

    def _answered(self, task: asyncio.Task[int]) -> None:
        del self._in_flight[task]
        self._send_queued()

    async def _run(self, job: J) -> int:
        try:
            accepted = await self._send(job)
        except Exception as exc:  # not swallowed: the next call or flush raises it
            self._failed(job, exc)
            self._errors.append(exc)
            return 0
        self.accepted += accepted
        return accepted

    async def _abort(self, *, cancel: bool) -> None:
        """Send nothing more; wait for the jobs in flight, or cancel them first."""
        self.drop(lambda job: True)
        tasks = set(self._in_flight)
        if cancel:
            for task in tasks:
                task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._errors.clear()
