"""A pipelined writer: items appended one by one, pushed in batches with several requests in
flight.

::

    async with rb.writer("rollouts", max_in_flight=8, batch_items=64) as w:
        for step in steps:
            await w.append(step.key, {"obs": step.obs, "reward": step.reward}, priority=1.0)
        await w.flush()        # optional: returns once every batch is answered

:meth:`Writer.append` packs the value at once (changing an array after appending it does not
change what is sent) and buffers the item; every ``batch_items`` items make one push,
sent as a task the writer owns, while the caller goes on appending. At most
``max_in_flight`` pushes are in flight: the next one waits for a slot, which is the writer's
backpressure. A push that fails (after the client's own retries) does not stop the others:
its error is raised by the next :meth:`~Writer.append` or :meth:`~Writer.flush`, once,
noting how many items it lost. Exiting the ``async with`` block flushes.

Order: batches are sent in the order their items were appended, whichever task appends.
Pushes in flight together may be applied in either order, but a batch holding a key that is
still in flight in an earlier push waits for that push's answer (and later batches wait
behind it), so the last value appended for a key is the one stored.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, NamedTuple, Self

from rlreplay.clients.bodies import packed_item
from rlreplay.wire.schemas import DEFAULT_PRIORITY, ItemIn

__all__ = ["Writer"]

#: Sends one batch of items and returns how many the server accepted.
Send = Callable[[list[ItemIn]], Awaitable[int]]


class _Batch(NamedTuple):
    items: list[ItemIn]
    keys: frozenset[str]
    #: True once the batch is sent; False when the block exited before it was.
    sent: asyncio.Future[bool]


class Writer:
    """Buffers appended items and pushes them in batches, several in flight (see the module).

    Args:
        send: Pushes one batch (:meth:`ReplayClient.writer
            <rlreplay.clients.client.ReplayClient.writer>` passes the client's push).
        max_in_flight: Pushes in flight at most (at least 1).
        batch_items: Items per push (at least 1).
    """

    def __init__(self, send: Send, *, max_in_flight: int = 8, batch_items: int = 64) -> None:
        for name, count in (("max_in_flight", max_in_flight), ("batch_items", batch_items)):
            if isinstance(count, bool) or not isinstance(count, int):
                raise TypeError(f"{name} ({count!r}) must be an int")
            if count < 1:
                raise ValueError(f"{name} ({count}) must be >= 1")
        self._send = send
        self._max_in_flight = max_in_flight
        self._batch_items = batch_items
        self._buffer: list[ItemIn] = []
        # Batches out of the buffer, not sent yet, oldest first: only the oldest may be sent
        # next, so a later batch never overtakes an earlier one holding the same key.
        self._queued: deque[_Batch] = deque()
        self._in_flight: dict[asyncio.Task[int], frozenset[str]] = {}
        self._errors: list[BaseException] = []
        self._closed = False
        #: Items the server has accepted so far.
        self.pushed = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Flushes. When the block raised an exception, sends nothing more (buffered items and
        batches waiting to be sent are dropped) and waits for the pushes in flight, whose
        errors give way to the block's. When the block (or this flush) was cancelled or
        interrupted, cancels the pushes in flight and returns without waiting for their
        answers: their items may or may not be stored."""
        self._closed = True  # first: whatever happens below, later appends are refused
        if exc is None:
            try:
                await self.flush()
            except BaseException as error:
                if not isinstance(error, Exception):
                    await self._abort(cancel=True)
                raise
        else:
            await self._abort(cancel=not isinstance(exc, Exception))

    @property
    def in_flight(self) -> int:
        """Pushes sent and not answered yet."""
        return len(self._in_flight)

    async def append(self, key: str, value: Any, priority: float = DEFAULT_PRIORITY) -> None:
        """Buffer one item (its value packed now); a full batch is sent.

        When this call raises a push's error, or for a value with no wire form, the item given
        to this call is not taken: append it again to store it. A taken item is sent even when
        this call is cancelled while its batch waits for a slot, unless the block exits first.

        Raises:
            ReplayError: A push sent earlier failed (raised once; its items are lost).
            TypeError: The value has no wire form.
            RuntimeError: The writer's block has exited, or exited before this item's batch
                was sent (the batch is dropped).
        """
        self._check_open()
        self._raise_error()
        self._buffer.append(packed_item(key, value, priority))
        if len(self._buffer) >= self._batch_items:
            batch = self._queue_buffer()
            if not await batch.sent:
                raise RuntimeError("the writer's async with block exited before this item was sent")

    async def flush(self) -> None:
        """Send what is buffered and return once every push is answered.

        Raises:
            ReplayError: A push failed (the first error; the number of items lost noted).
        """
        if self._buffer:
            self._queue_buffer()
        # A queued batch waits only for pushes in flight, so this drains the queue too.
        while self._in_flight:
            await asyncio.wait(set(self._in_flight))
        if self._errors:
            first, *others = self._errors
            self._errors.clear()
            if others:
                first.add_note(f"{len(others)} more batches failed too")
            raise first

    def _queue_buffer(self) -> _Batch:
        items, self._buffer = self._buffer, []
        keys = frozenset(item.key for item in items)
        batch = _Batch(items, keys, asyncio.get_running_loop().create_future())
        self._queued.append(batch)
        self._send_queued()
        return batch

    def _send_queued(self) -> None:
        """Send the oldest queued batches while a slot is free and no push in flight holds one
        of their keys; called whenever a batch is queued or a push is answered."""
        while self._queued and len(self._in_flight) < self._max_in_flight:
            batch = self._queued[0]
            if any(keys & batch.keys for keys in self._in_flight.values()):
                return
            self._queued.popleft()
            task = asyncio.create_task(self._push(batch.items))
            self._in_flight[task] = batch.keys
            task.add_done_callback(self._answered)
            if not batch.sent.done():  # done: its append was cancelled, the batch goes anyway
                batch.sent.set_result(True)

    def _answered(self, task: asyncio.Task[int]) -> None:
        del self._in_flight[task]
        self._send_queued()

    async def _push(self, batch: list[ItemIn]) -> int:
        try:
            accepted = await self._send(batch)
        except Exception as exc:  # not swallowed: the next append or flush raises it
            exc.add_note(
                f"the writer's batch of {len(batch)} items from key {batch[0].key!r} to "
                f"{batch[-1].key!r} was not pushed"
            )
            self._errors.append(exc)
            return 0
        self.pushed += accepted
        return accepted

    async def _abort(self, *, cancel: bool) -> None:
        """Send nothing more; wait for the pushes in flight, or cancel them first."""
        self._buffer.clear()
        while self._queued:
            sent = self._queued.popleft().sent
            if not sent.done():
                sent.set_result(False)
        tasks = set(self._in_flight)
        if cancel:
            for task in tasks:
                task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._errors.clear()

    def _raise_error(self) -> None:
        if self._errors:
            raise self._errors.pop(0)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the writer's async with block has exited")
