"""The synchronous sharded client: :class:`~rlreplay.clients.sharded.ShardedReplayClient`'s
calls, made from plain code, as :class:`~rlreplay.clients.sync_client.Client` makes
``ReplayClient``'s (see there how it works, and where it may be called from).

Its methods mirror ``ShardedReplayClient``'s one for one, with the same parameters: the calls
every client shares are :class:`~rlreplay.clients.sync_calls.BlockingCalls`', the sharded
ones are here (``tests/clients/test_surface.py`` compares the signatures).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Unpack, overload

from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.episode_bodies import window_sample
from rlreplay.clients.sharded import ShardedReplayClient
from rlreplay.clients.surface import WindowOptions
from rlreplay.clients.sync_calls import BlockingCalls
from rlreplay.clients.types import Item, Layout
from rlreplay.clients.windows import WindowBatch

__all__ = ["ShardedClient"]


class ShardedClient(BlockingCalls[ShardedReplayClient]):
    """A synchronous client of several replay servers, each table spread over all of them
    (``ShardedReplayClient``'s calls, blocking)::

        with rlreplay.ShardedClient(["http://replay-0:8000", "http://replay-1:8000"]) as rb:
            rb.push("default", [{"key": "k", "value": {"obs": np.zeros(4)}}])
            batch = rb.sample("default", batch_size=32)

    The arguments are ``ShardedReplayClient``'s.
    """

    def __init__(
        self,
        urls: Sequence[str],
        api_key: str | None = None,
        *,
        allow_partial: bool = False,
        seed: int | None = None,
        shard_names: Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(
            "rlreplay-sharded-client",
            lambda: ShardedReplayClient(
                urls,
                api_key,
                allow_partial=allow_partial,
                seed=seed,
                shard_names=shard_names,
                **options,
            ),
        )

    @property
    def urls(self) -> list[str]:
        """The servers' normalized URLs."""
        return self._rb.urls

    def owner(self, key: str) -> str:
        """The URL of the server that holds ``key``."""
        return self._rb.owner(key)

    @overload
    def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_ms: int | None = ...,
        include_values: bool = ...,
        layout: Literal["items"] = ...,
        where: Mapping[str, Any] | None = ...,
        allow_partial: bool | None = ...,
    ) -> list[Item]: ...
    @overload
    def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_ms: int | None = ...,
        include_values: bool = ...,
        layout: Literal["columns"],
        where: Mapping[str, Any] | None = ...,
        allow_partial: bool | None = ...,
    ) -> ColumnBatch: ...
    @overload
    def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_ms: int | None = ...,
        allow_partial: bool | None = ...,
        **window: Unpack[WindowOptions],
    ) -> WindowBatch: ...
    def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_ms: int | None = None,
        include_values: bool = True,
        layout: Layout = "items",
        where: Mapping[str, Any] | None = None,
        allow_partial: bool | None = None,
        **window: Unpack[WindowOptions],
    ) -> list[Item] | ColumnBatch | WindowBatch:
        """Sample a batch over every server, with replacement, or windows of an episode
        table given window options (:meth:`ShardedReplayClient.sample`)."""
        if window_sample(window, layout, include_values):
            call = self._rb.sample(
                table, batch_size, timeout_ms=timeout_ms, allow_partial=allow_partial, **window
            )
            return self._loop.run(call)
        if layout == "columns":
            return self._loop.run(
                self._rb.sample(
                    table,
                    batch_size,
                    timeout_ms=timeout_ms,
                    include_values=include_values,
                    layout="columns",
                    allow_partial=allow_partial,
                    where=where,
                )
            )
        return self._loop.run(
            self._rb.sample(
                table,
                batch_size,
                timeout_ms=timeout_ms,
                include_values=include_values,
                allow_partial=allow_partial,
                where=where,
            )
        )

    def snapshot(
        self, tables: Iterable[str] | None = None, *, timeout_s: float = 3600.0
    ) -> dict[str, dict[str, Any]]:
        """A snapshot on every server, each to its own backup URL: answers by server URL."""
        return self._loop.run(self._rb.snapshot(tables, timeout_s=timeout_s))

    def snapshots(self) -> dict[str, list[dict[str, Any]]]:
        """Each server's snapshots, newest first, by server URL."""
        return self._loop.run(self._rb.snapshots())
