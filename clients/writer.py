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
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self

from rlreplay.clients.bodies import packed_item
from rlreplay.clients.in_flight import InFlight, count_argument
from rlreplay.wire.schemas import DEFAULT_PRIORITY, ItemIn

__all__ = ["Writer"]

#: Sends one batch of items and returns how many the server accepted.
Send = Callable[[list[ItemIn]], Awaitable[int]]


def _lost(batch: list[ItemIn], exc: Exception) -> None:
    exc.add_note(
        f"the writer's batch of {len(batch)} items from key {batch[0].key!r} to "
        f"{batch[-1].key!r} was not pushed"
    )


class Writer:
    """Buffers appended items and pushes them in batches, several in flight (see the module).

    The batches are sent by an :class:`~rlreplay.clients.in_flight.InFlight` it holds, in
    order, each after the pushes in flight that hold one of its keys.

    Args:
        send: Pushes one batch (:meth:`Items.writer
            <rlreplay.clients.items.Items.writer>` passes the client's push).
        max_in_flight: Pushes in flight at most (at least 1).
        batch_items: Items per push (at least 1).
    """

    def __init__(self, send: Send, *, max_in_flight: int = 8, batch_items: int = 64) -> None:
        self._pushes = InFlight(
            send,
            max_in_flight=max_in_flight,
            in_order=True,
            failed=_lost,
            owner="the writer",
            jobs="batches",
        )
        self._batch_items = count_argument("batch_items", batch_items)
        self._buffer: list[ItemIn] = []

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
        if exc is None and self._buffer:
            self._queue_buffer()
        self._buffer.clear()
        await self._pushes.close(exc)

    @property
    def pushed(self) -> int:
        """Items the server has accepted so far."""
        return self._pushes.accepted

    @property
    def in_flight(self) -> int:
        """Pushes sent and not answered yet."""
        return self._pushes.in_flight

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
        self._pushes.check_open()
        self._pushes.raise_error()
        self._buffer.append(packed_item(key, value, priority))
        if len(self._buffer) >= self._batch_items:
            if not await self._queue_buffer():
                raise RuntimeError("the writer's async with block exited before this item was sent")

    async def flush(self) -> None:
        """Send what is buffered and return once every push is answered.

        Raises:
            ReplayError: A push failed (the first error; the number of items lost noted).
        """
        if self._buffer:
            self._queue_buffer()
        await self._pushes.flush()

    def _queue_buffer(self) -> asyncio.Future[bool]:
        items, self._buffer = self._buffer, []
        return self._pushes.queue(items, frozenset(item.key for item in items))
