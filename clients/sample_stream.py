"""``stream()`` of every async client: samples without end, ``prefetch`` requests in flight."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from rlreplay.clients.episode_bodies import window_sample
from rlreplay.clients.prefetch import prefetched
from rlreplay.clients.surface import WindowOptions

__all__ = ["sample_stream"]


async def sample_stream(
    sample: Callable[..., Awaitable[Any]],
    table: str,
    *,
    batch_size: int,
    prefetch: int,
    timeout_ms: int | None,
    include_values: bool,
    layout: str,
    window: WindowOptions,
) -> AsyncIterator[Any]:
    """The batches of ``sample`` (a client's ``sample`` call) with these arguments, in the
    order they arrive; window options sample windows (``layout`` and ``include_values``
    then refused, as ``sample`` does). Closing it cancels the requests in flight."""
    windows = window_sample(window, layout, include_values)

    async def one() -> Any:
        if windows:
            return await sample(table, batch_size, timeout_ms=timeout_ms, **window)
        return await sample(
            table, batch_size, timeout_ms=timeout_ms, include_values=include_values, layout=layout
        )

    async with aclosing(prefetched(one, prefetch)) as batches:
        async for batch in batches:
            yield batch
