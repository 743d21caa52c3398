"""Following a table's change feed into a :class:`~rlreplay.gpu.device_index.DeviceIndex`.

The follower loads ``/index`` once, then applies the events after its ``seq`` page by page,
in order, so its index holds the server's state as of its ``seq``. Told 410 ``gone`` (it
fell behind the server's ring, or the server restarted and numbers from 0 again), or
answered by a feed of another epoch, it reloads from ``/index``. While the server cannot
be reached it keeps what it has and tries again, so a restarted server is picked up where
it left off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from rlreplay.clients.client import ReplayClient
from rlreplay.gpu.device_index import DeviceIndex
from rlreplay.wire.errors import Gone, ReplayError

__all__ = ["ChangeFollower"]

log = logging.getLogger("rlreplay.gpu")


class ChangeFollower:
    """Keeps a device index equal to one server table.

    ``start()`` runs a background task that long-polls the feed; ``stop()`` ends it
    (idempotent). :meth:`catch_up` applies whatever the server has now, for a caller that
    needs the latest state (a draw that found a chosen item deleted).

    Args:
        client: The replay service's client.
        table: The table to follow.
        index: The index to keep.
        page: Events asked for per request.
        wait_ms: How long one long poll waits for an event.
        retry_s: Pause after a failed request (server down, table missing).
    """

    def __init__(
        self,
        client: ReplayClient,
        table: str,
        index: DeviceIndex,
        *,
        page: int = 10_000,
        wait_ms: int = 1000,
        retry_s: float = 0.2,
    ) -> None:
        self.client = client
        self.table = table
        self.index = index
        self.page = page
        self.wait_ms = wait_ms
        self.retry_s = retry_s
        self.seq = 0
        self.epoch: int | None = None
        #: the server's last event, as of the last answer
        self.server_seq = 0
        self.resyncs = 0
        self.events_applied = 0
        self.last_error: str | None = None
        self._synced_at: float | None = None  # monotonic time the index was last caught up
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    # -- state -----------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        """Whether the index was loaded from the server at least once."""
        return self.epoch is not None

    @property
    def caught_up(self) -> bool:
        """Whether the last answer found nothing left to apply, and nothing failed since."""
        return self.loaded and self.seq >= self.server_seq and self.last_error is None

    @property
    def lag_events(self) -> int:
        """Events the server had, as of the last answer, that the index has not applied."""
        return max(0, self.server_seq - self.seq)

    @property
    def lag_s(self) -> float:
        """Seconds since the index was last caught up (0 while it is)."""
        if self.caught_up:
            return 0.0
        if self._synced_at is None:
            return float("inf")
        return time.monotonic() - self._synced_at

    # -- work ------------------------------------------------------------------------------

    async def resync(self) -> None:
        """Reload the whole state from ``/index``."""
        async with self._lock:
            await self._resync()

    async def _resync(self) -> None:
        state = await self.client.table_index(self.table)
        self.index.load(state["keys"], state["priorities"], state["inserted_at"])
        self.seq = self.server_seq = int(state["seq"])
        self.epoch = int(state["epoch"])
        self.resyncs += 1
        self._synced_at = time.monotonic()
        self.last_error = None

    async def poll(self, wait_ms: int = 0) -> int:
        """One page of changes (waiting up to ``wait_ms`` for one), applied; how many."""
        async with self._lock:
            if not self.loaded:
                await self._resync()
            try:
                answer = await self.client.changes(
                    self.table, self.seq, limit=self.page, wait_ms=wait_ms
                )
            except Gone:
                await self._resync()
                return 0
            return self._apply(answer)

    def _apply(self, answer: dict[str, Any]) -> int:
        if int(answer["epoch"]) != self.epoch:  # another feed: numbers mean nothing here
            raise Gone("the server's feed changed epoch")
        events: list[dict[str, Any]] = answer["events"]
        if events:
            self.index.apply(events)
            self.seq = int(events[-1]["seq"])
            self.events_applied += len(events)
        self.server_seq = int(answer["seq"])
        self.last_error = None
        if self.seq >= self.server_seq:
            self._synced_at = time.monotonic()
        return len(events)

    async def catch_up(self) -> None:
        """Apply every change the server has now (no waiting); reload if told to."""
        while True:
            try:
                got = await self.poll(0)
            except Gone:
                await self.resync()
                continue
            if not got or self.seq >= self.server_seq:
                return

    # -- the background task -----------------------------------------------------------------

    def start(self) -> None:
        """Start following in a background task (owned here; :meth:`stop` ends it)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"rlreplay-follow-{self.table}"
            )

    async def stop(self) -> None:
        """Stop following (idempotent)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        try:
            while True:
                try:
                    behind = self.seq < self.server_seq
                    await self.poll(0 if behind else self.wait_ms)
                except Gone:
                    try:
                        await self.resync()
                    except ReplayError as exc:
                        await self._failed(exc)
                except ReplayError as exc:
                    await self._failed(exc)
                except (KeyError, TypeError, ValueError) as exc:  # an answer not of the contract
                    await self._failed(ReplayError(f"malformed answer: {exc!r}"))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: never caught up again, and said so
            self.last_error = f"the follower stopped: {exc!r}"
            log.exception("following %r stopped", self.table)
            raise

    async def _failed(self, exc: ReplayError) -> None:
        if self.last_error is None:
            log.warning("following %r failed (%s); trying again", self.table, exc)
        self.last_error = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(self.retry_s)
