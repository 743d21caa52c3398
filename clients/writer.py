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

Order: pushes in flight together may be applied in either order, but an item whose key is
still in flight in an earlier push waits for that push's answer before its own is sent, so
the last value appended for a key is the one stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self

from rlreplay.clients.bodies import packed_item
from rlreplay.wire.schemas import DEFAULT_PRIORITY, ItemIn

__all__ = ["Writer"]

#: Sends one batch of items and returns how many the server accepted.
Send = Callable[[list[ItemIn]], Awaitable[int]]


class Writer:
    """Buffers appended items and pushes them in batches, several in flight (see the module).

    Args:
        send: Pushes one batch (:meth:`ReplayClient.writer
            <rlreplay.clients.client.ReplayClient.writer>` passes the client's push).
        max_in_flight: Pushes in flight at most (at least 1).
        batch_items: Items per push (at least 1).
    """

    def __init__(self, send: Send, *, max_in_flight: int = 8, batch_items: int = 64) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight ({max_in_flight}) must be >= 1")
        if batch_items < 1:
            raise ValueError(f"batch_items ({batch_items}) must be >= 1")
        self._send = send
        self._max_in_flight = max_in_flight
        self._batch_items = batch_items
        self._buffer: list[ItemIn] = []
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
        """Flushes; when the block raised, only waits for the pushes in flight (their
        errors give way to the block's) and drops the buffered items."""
        if exc_type is None:
            await self.flush()
        else:
            self._buffer.clear()
            await self._wait(set(self._in_flight))
            self._errors.clear()
        self._closed = True

    @property
    def in_flight(self) -> int:
        """Pushes sent and not answered yet."""
        return len(self._in_flight)

    async def append(self, key: str, value: Any, priority: float = DEFAULT_PRIORITY) -> None:
        """Buffer one item (its value packed now); a full batch is sent.

        Raises:
            ReplayError: A push sent earlier failed (raised once; its items are lost).
            TypeError: The value has no wire form.
            RuntimeError: The writer's block has exited.
        """
        self._check_open()
        self._raise_error()
        self._buffer.append(packed_item(key, value, priority))
        if len(self._buffer) >= self._batch_items:
            await self._send_buffer()

    async def flush(self) -> None:
        """Send what is buffered and return once every push is answered.

        Raises:
            ReplayError: A push failed (the first error; the number of items lost noted).
        """
        if self._buffer:
            await self._send_buffer()
        await self._wait(set(self._in_flight))
        if self._errors:
            first, *others = self._errors
            self._errors.clear()
            if others:
                first.add_note(f"{len(others)} more batches failed too")
            raise first

    async def _send_buffer(self) -> None:
        batch, self._buffer = self._buffer, []
        keys = frozenset(item.key for item in batch)
        while True:
            earlier = {task for task, sent in self._in_flight.items() if sent & keys}
            if not earlier and len(self._in_flight) < self._max_in_flight:
                break
            await self._wait(earlier or set(self._in_flight), first=not earlier)
        task = asyncio.create_task(self._push(batch))
        self._in_flight[task] = keys

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

    async def _wait(self, tasks: set[asyncio.Task[int]], *, first: bool = False) -> None:
        """Wait for ``tasks`` (any one of them with ``first``), then forget the finished."""
        if tasks:
            mode = asyncio.FIRST_COMPLETED if first else asyncio.ALL_COMPLETED
            await asyncio.wait(tasks, return_when=mode)
        for task in [task for task in self._in_flight if task.done()]:
            del self._in_flight[task]

    def _raise_error(self) -> None:
        if self._errors:
            raise self._errors.pop(0)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the writer's async with block has exited")
