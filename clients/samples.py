"""The sample calls of the client: batches of items or windows of episodes, one request
at a time or streamed with several in flight (the contract's "Sampling")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any, Final, Unpack

from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.episode_bodies import window_request, window_sample
from rlreplay.clients.requester import Requester, answer_map, table_path
from rlreplay.clients.sample_stream import sample_stream
from rlreplay.clients.surface import WindowOptions
from rlreplay.clients.types import Item, Layout
from rlreplay.clients.windows import WindowBatch
from rlreplay.wire.schemas import DEFAULT_TIMEOUT_MS, SampleRequest

__all__ = ["Samples"]

_SERVER_SAMPLE_TIMEOUT_S: Final = DEFAULT_TIMEOUT_MS / 1000
_SAMPLE_TIMEOUT_MARGIN_S: Final = 5.0


class Samples:
    """The sample calls of :class:`~rlreplay.clients.client.ReplayClient`.

    Args:
        requester: Sends the calls to the server.
    """

    def __init__(self, requester: Requester) -> None:
        self._requester = requester

    async def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_ms: int | None = None,
        include_values: bool = True,
        layout: Layout = "items",
        where: Mapping[str, Any] | None = None,
        **window: Unpack[WindowOptions],
    ) -> list[Item] | ColumnBatch | WindowBatch:
        """Sample a batch (``key``, ``value``, ``priority``, ``probability``, ``weight``...),
        or windows of an episode table.

        A call given any window option (:class:`~rlreplay.clients.surface.WindowOptions`)
        samples windows of consecutive steps of an episode table and answers a
        :class:`~rlreplay.clients.windows.WindowBatch` (``[B, W, ...]`` arrays); one given
        none samples items (the route is the same; the options say what is asked)::

            windows = await rb.sample("episodes", 64, length=80, burn_in=40)
            transitions = await rb.sample("episodes", 256, n_step=3, next_fields=["obs"])

        Args:
            table: The table.
            batch_size: How many items to draw.
            timeout_ms: How long the rate limiter may hold the request (server default when
                None, 10 s).
            include_values: Leave values out of the answer when False.
            layout: ``"columns"`` answers a :class:`ColumnBatch`: each field of the values
                stacked along a new first axis, no per-item objects. In either layout the
                arrays are views of the buffer the answer was read into, valid for as long
                as anything holds them (see :meth:`~rlreplay.clients.items.Items.get_many`).
            where: Draw only among items whose tags meet every condition (``{tag: value |
                {"in": [...]} | {"gte"?, "gt"?, "lte"?, "lt"?}}``), waiting up to
                ``timeout_ms`` for a match.
            **window: Window options: sample windows of an episode table.

        Raises:
            DeadlineExceeded: The rate limiter did not allow the sample in time.
            ValidationFailed: With ``layout="columns"``, values that do not stack (naming
                the field); the sample consumed nothing.
            TableNotFound, ValidationFailed: As the contract says.
            TypeError: Window options with ``layout`` or ``include_values``, or an unknown
                option (nothing is sent).
        """
        if window_sample(window, layout, include_values):
            return await self.sample_windows(table, batch_size, timeout_ms, window)
        body = SampleRequest(
            batch_size,
            DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms,
            include_values,
            layout,
        )
        if where is not None:
            body.where = dict(where)
        waits_s = (timeout_ms / 1000) if timeout_ms is not None else _SERVER_SAMPLE_TIMEOUT_S
        answer = await self._requester.call(
            "POST",
            table_path(table, "/sample"),
            body=body,
            idempotent=False,
            read_timeout_s=max(self._requester.timeout_s, waits_s + _SAMPLE_TIMEOUT_MARGIN_S),
            views=True,
        )
        if layout == "columns":
            return ColumnBatch.from_answer(answer)
        return list(answer_map(answer).get("items", []))

    def stream(
        self,
        table: str,
        *,
        batch_size: int = 64,
        prefetch: int = 4,
        timeout_ms: int | None = None,
        include_values: bool = True,
        layout: Layout = "items",
        **window: Unpack[WindowOptions],
    ) -> AsyncIterator[list[Item] | ColumnBatch | WindowBatch]:
        """Sample batches without end, keeping ``prefetch`` sample requests in flight.

        The requests are tasks owned by the generator: while the caller works on one batch,
        ``prefetch`` more are being fetched. Batches are yielded in the order they arrive.
        Closing the generator cancels the requests still in flight; wrap it in
        ``contextlib.aclosing`` so that a ``break`` closes it at once (otherwise the event
        loop's async-generator finaliser closes it soon after it is dropped)::

            async with aclosing(rb.stream("t", batch_size=64)) as batches:
                async for batch in batches:
                    ...

        An error of any request (``DeadlineExceeded`` when the rate limiter holds samples
        past ``timeout_ms``) ends the stream with that error.

        Args:
            table: The table.
            batch_size: Items per batch.
            prefetch: Sample requests kept in flight (at least 1).
            timeout_ms: Passed to every :meth:`sample`.
            include_values: Passed to every :meth:`sample`.
            layout: Passed to every :meth:`sample`: ``"columns"`` yields
                :class:`ColumnBatch` objects.
            **window: Passed to every :meth:`sample`: window options yield
                :class:`~rlreplay.clients.windows.WindowBatch` objects.

        Yields:
            One sampled batch at a time.
        """
        batches = sample_stream(
            self.sample,
            table,
            batch_size=batch_size,
            prefetch=prefetch,
            timeout_ms=timeout_ms,
            include_values=include_values,
            layout=layout,
            window=window,
        )
        # the answers in flight, the batch the caller holds and the one it just let go: with
        # fewer receive buffers, long answers would each land in a fresh one
        return _holding_buffers(self._requester, prefetch + 2, batches)

    async def sample_windows(
        self, table: str, batch_size: int, timeout_ms: int | None, window: WindowOptions
    ) -> WindowBatch:
        """A window sample of this server (``sample`` with window options; the sharded
        client sends its own here)."""
        body = window_request(batch_size, timeout_ms, window)
        waits_s = body.timeout_ms / 1000
        answer = await self._requester.call(
            "POST",
            table_path(table, "/sample"),
            body=body,
            idempotent=False,
            read_timeout_s=max(self._requester.timeout_s, waits_s + _SAMPLE_TIMEOUT_MARGIN_S),
            views=True,
        )
        return WindowBatch.from_answer(answer)


async def _holding_buffers(
    requester: Requester, count: int, batches: AsyncIterator[Any]
) -> AsyncIterator[Any]:
    """``batches``, with the requester keeping ``count`` receive buffers meanwhile."""
    with requester.receive_buffers(count):
        async with aclosing(batches):  # type: ignore[type-var]
            async for batch in batches:
                yield batch
