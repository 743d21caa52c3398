"""The synchronous sharded client: :class:`~rlreplay.clients.sharded.ShardedReplayClient`'s
calls, made from plain code, as :class:`~rlreplay.clients.sync_client.Client` makes
``ReplayClient``'s (see there how it works, and where it may be called from).

Its methods mirror ``ShardedReplayClient``'s one for one, with the same parameters (a test
compares the signatures).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self, overload

from rlreplay.clients.client import Item, Layout
from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.loop_thread import LoopThread
from rlreplay.clients.rollouts import LeaseBase
from rlreplay.clients.sharded import ShardedReplayClient
from rlreplay.clients.sync_lease import SyncLease
from rlreplay.clients.sync_stream import SyncStream
from rlreplay.clients.sync_writer import SyncWriter
from rlreplay.wire.schemas import DEFAULT_TIMEOUT_MS

__all__ = ["ShardedClient"]


async def _sharded_client(*args: Any, **kwargs: Any) -> ShardedReplayClient:
    """A ShardedReplayClient made on the loop that will run it."""
    return ShardedReplayClient(*args, **kwargs)


class ShardedClient:
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
        self._loop = LoopThread("rlreplay-sharded-client")
        try:
            self._rb = self._loop.run(
                _sharded_client(
                    urls,
                    api_key,
                    allow_partial=allow_partial,
                    seed=seed,
                    shard_names=shard_names,
                    **options,
                )
            )
        except BaseException:
            self._loop.close()
            raise
        self._loop.on_close(self._rb.aclose)
        # Holds the loop thread, not the client: dropping the client stops the thread.
        self._finalizer = weakref.finalize(self, self._loop.close)

    @property
    def urls(self) -> list[str]:
        """The servers' normalized URLs."""
        return self._rb.urls

    @property
    def async_client(self) -> ShardedReplayClient:
        """The ``ShardedReplayClient`` the calls run on; await it only on :attr:`thread`'s
        loop."""
        return self._rb

    @property
    def thread(self) -> threading.Thread:
        """The ``threading.Thread`` the client's event loop runs on."""
        return self._loop.thread

    def owner(self, key: str) -> str:
        """The URL of the server that holds ``key``."""
        return self._rb.owner(key)

    def close(self) -> None:
        """Cancel calls still running, close the connections and stop the thread.

        Calling it again does nothing; calls after it raise ``ReplayError``.
        """
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- tables -----------------------------------------------------------------------------

    def create_table(
        self,
        name: str,
        *,
        sampler: Mapping[str, Any] | None = None,
        remover: Mapping[str, Any] | None = None,
        max_size: int | None = None,
        max_times_sampled: int = 0,
        rate_limiter: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Create the table on every server, or confirm it
        (:meth:`ShardedReplayClient.create_table`)."""
        return self._loop.run(
            self._rb.create_table(
                name,
                sampler=sampler,
                remover=remover,
                max_size=max_size,
                max_times_sampled=max_times_sampled,
                rate_limiter=rate_limiter,
            )
        )

    def list_tables(self) -> list[dict[str, Any]]:
        """Every table, each with its config and stats."""
        return self._loop.run(self._rb.list_tables())

    def describe_table(self, name: str) -> dict[str, Any]:
        """A table's config and stats (:meth:`ShardedReplayClient.describe_table`)."""
        return self._loop.run(self._rb.describe_table(name))

    def drop_table(self, name: str) -> None:
        """Delete a table and its data."""
        self._loop.run(self._rb.drop_table(name))

    # --- items ------------------------------------------------------------------------------

    def push(self, table: str, items: Sequence[Mapping[str, Any]], *, wait: bool = False) -> int:
        """Insert or replace items (:meth:`ShardedReplayClient.push`); how many were accepted."""
        return self._loop.run(self._rb.push(table, items, wait=wait))

    def push_columns(
        self,
        table: str,
        keys: Sequence[str],
        columns: Mapping[str, Any],
        *,
        priorities: Any = None,
        wait: bool = False,
    ) -> int:
        """Insert or replace items given as columns (:meth:`ShardedReplayClient.push_columns`)."""
        return self._loop.run(
            self._rb.push_columns(table, keys, columns, priorities=priorities, wait=wait)
        )

    def writer(self, table: str, *, max_in_flight: int = 8, batch_items: int = 64) -> SyncWriter:
        """A pipelined writer into ``table`` (:class:`~rlreplay.clients.sync_writer.SyncWriter`)::

        with rb.writer("t", max_in_flight=8, batch_items=64) as w:
            w.append(key, value, priority)
        """
        return SyncWriter(
            self._loop,
            self._rb.writer(table, max_in_flight=max_in_flight, batch_items=batch_items),
        )

    def get(self, table: str, key: str) -> Item | None:
        """One item, or None when the table holds no such key (:meth:`ShardedReplayClient.get`)."""
        return self._loop.run(self._rb.get(table, key))

    @overload
    def get_many(
        self, table: str, keys: Iterable[str], *, layout: Literal["items"] = ...
    ) -> list[Item | None]: ...
    @overload
    def get_many(
        self, table: str, keys: Iterable[str], *, layout: Literal["columns"]
    ) -> ColumnBatch: ...
    def get_many(
        self, table: str, keys: Iterable[str], *, layout: Layout = "items"
    ) -> list[Item | None] | ColumnBatch:
        """Several items from their servers, in the order asked
        (:meth:`ShardedReplayClient.get_many`)."""
        if layout == "columns":
            return self._loop.run(self._rb.get_many(table, keys, layout="columns"))
        return self._loop.run(self._rb.get_many(table, keys))

    @overload
    def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_ms: int | None = ...,
        include_values: bool = ...,
        layout: Literal["items"] = ...,
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
        allow_partial: bool | None = ...,
    ) -> ColumnBatch: ...
    def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_ms: int | None = None,
        include_values: bool = True,
        layout: Layout = "items",
        allow_partial: bool | None = None,
    ) -> list[Item] | ColumnBatch:
        """Sample a batch over every server, with replacement
        (:meth:`ShardedReplayClient.sample`)."""
        if layout == "columns":
            return self._loop.run(
                self._rb.sample(
                    table,
                    batch_size,
                    timeout_ms=timeout_ms,
                    include_values=include_values,
                    layout="columns",
                    allow_partial=allow_partial,
                )
            )
        return self._loop.run(
            self._rb.sample(table, batch_size, timeout_ms=timeout_ms, include_values=include_values)
        )

    def update_priorities(self, table: str, priorities: Mapping[str, float]) -> dict[str, int]:
        """Set items' priorities; ``{"updated": n, "missing": m}``."""
        return self._loop.run(self._rb.update_priorities(table, priorities))

    def delete(self, table: str, keys: Iterable[str]) -> int:
        """Delete items; how many deletions the server accepted."""
        return self._loop.run(self._rb.delete(table, keys))

    def snapshot(
        self, tables: Iterable[str] | None = None, *, timeout_s: float = 3600.0
    ) -> dict[str, dict[str, Any]]:
        """A snapshot on every server, each to its own backup URL: answers by server URL."""
        return self._loop.run(self._rb.snapshot(tables, timeout_s=timeout_s))

    def snapshots(self) -> dict[str, list[dict[str, Any]]]:
        """Each server's snapshots, newest first, by server URL."""
        return self._loop.run(self._rb.snapshots())

    @overload
    def stream(
        self,
        table: str,
        *,
        batch_size: int = ...,
        prefetch: int = ...,
        timeout_ms: int | None = ...,
        include_values: bool = ...,
        layout: Literal["items"] = ...,
    ) -> SyncStream[list[Item]]: ...
    @overload
    def stream(
        self,
        table: str,
        *,
        batch_size: int = ...,
        prefetch: int = ...,
        timeout_ms: int | None = ...,
        include_values: bool = ...,
        layout: Literal["columns"],
    ) -> SyncStream[ColumnBatch]: ...
    def stream(
        self,
        table: str,
        *,
        batch_size: int = 64,
        prefetch: int = 4,
        timeout_ms: int | None = None,
        include_values: bool = True,
        layout: Layout = "items",
    ) -> SyncStream[list[Item]] | SyncStream[ColumnBatch]:
        """Sampled batches without end, ``prefetch`` requests kept in flight on the loop
        thread while the caller works (:meth:`ShardedReplayClient.stream`). Close the iterator, or
        use it in a ``with`` block, to cancel them::

            with rb.stream("t", batch_size=64) as batches:
                for batch in batches:
                    ...
        """
        batches = self._rb.stream(
            table,
            batch_size=batch_size,
            prefetch=prefetch,
            timeout_ms=timeout_ms,
            include_values=include_values,
            layout=layout,
        )
        return SyncStream(self._loop, batches, _same)

    # --- rollout tables ---------------------------------------------------------------------

    def patch(
        self,
        table: str,
        items: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
        *,
        wait: bool = False,
    ) -> dict[str, int]:
        """Set fields of existing items' values on their servers
        (:meth:`ShardedReplayClient.patch`)."""
        return self._loop.run(self._rb.patch(table, items, wait=wait))

    def claim(
        self,
        table: str,
        *,
        task: str,
        batch_size: int,
        fields: Sequence[str] | None = None,
        group_size: int | None = None,
        lease_s: float = 60.0,
        wait_ms: int = DEFAULT_TIMEOUT_MS,
        partial: bool = False,
        min_version: int | None = None,
    ) -> SyncLease:
        """Claim items ready for ``task`` from every server under one lease
        (:meth:`ShardedReplayClient.claim`)."""
        lease = self._loop.run(
            self._rb.claim(
                table,
                task=task,
                batch_size=batch_size,
                fields=fields,
                group_size=group_size,
                lease_s=lease_s,
                wait_ms=wait_ms,
                partial=partial,
                min_version=min_version,
            )
        )
        return SyncLease(self._loop, lease)

    def set_version(self, table: str, version: int, *, force: bool = False) -> dict[str, int]:
        """Move the table's policy version forward; ``{"version", "dropped_stale"}``
        (``force``: see ``ReplayClient.set_version``)."""
        return self._loop.run(self._rb.set_version(table, version, force=force))

    def tasks(self, table: str) -> dict[str, Any]:
        """Per-task counts of a rollout table (:meth:`ShardedReplayClient.tasks`)."""
        return self._loop.run(self._rb.tasks(table))

    def consume(
        self,
        table: str,
        *,
        task: str,
        batch_size: int,
        fields: Sequence[str] | None = None,
        group_size: int | None = None,
        prefetch: int = 1,
        lease_s: float = 60.0,
        wait_ms: int = DEFAULT_TIMEOUT_MS,
        min_version: int | None = None,
    ) -> SyncStream[SyncLease]:
        """Leases one after another, each acknowledged when the next is asked for
        (:meth:`ShardedReplayClient.consume`); closing the iterator releases the lease in hand."""
        leases = self._rb.consume(
            table,
            task=task,
            batch_size=batch_size,
            fields=fields,
            group_size=group_size,
            prefetch=prefetch,
            lease_s=lease_s,
            wait_ms=wait_ms,
            min_version=min_version,
        )
        loop = self._loop

        def blocking(lease: LeaseBase) -> SyncLease:
            return SyncLease(loop, lease)

        return SyncStream(loop, leases, blocking)

    # --- service ----------------------------------------------------------------------------

    def health(self) -> bool:
        """Whether every server answers ``GET /healthz`` with 2xx."""
        return self._loop.run(self._rb.health())


def _same(batch: Any) -> Any:
    return batch
