"""The synchronous client: :class:`~rlreplay.clients.client.ReplayClient`'s calls, made from
plain code.

A :class:`Client` owns a :class:`~rlreplay.clients.loop_thread.LoopThread` and a
``ReplayClient`` living on it; each call runs the async call there and blocks until it is
answered. So it works where ``asyncio.run`` per call does not: from a training loop, from
several threads at once (their calls share one connection pool and run concurrently), in a
Jupyter notebook (whose main thread already runs a loop) and inside a running loop (which it
blocks while it waits, as any blocking call would; there, prefer ``ReplayClient``).

Its methods mirror ``ReplayClient``'s one for one, with the same parameters (a test compares
the signatures); ``writer()``, ``stream()``, ``claim()`` and ``consume()`` return blocking
forms of what the async calls return.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self, overload

import httpx

from rlreplay.clients.client import Item, Layout, ReplayClient
from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.loop_thread import LoopThread
from rlreplay.clients.rollouts import LeaseBase
from rlreplay.clients.sync_lease import SyncLease
from rlreplay.clients.sync_stream import SyncStream
from rlreplay.clients.sync_writer import SyncWriter
from rlreplay.wire.schemas import DEFAULT_TIMEOUT_MS

__all__ = ["Client"]


async def _replay_client(*args: Any, **kwargs: Any) -> ReplayClient:
    """A ReplayClient made on the loop that will run it."""
    return ReplayClient(*args, **kwargs)


class Client:
    """A synchronous client of one replay server (``ReplayClient``'s calls, blocking).

    Use it as a context manager (or call :meth:`close`)::

        with rlreplay.Client("http://127.0.0.1:8000") as rb:
            rb.push("default", [{"key": "k", "value": {"obs": np.zeros(4)}}])
            batch = rb.sample("default", batch_size=32)

    It runs a ``ReplayClient`` on an event loop in a thread of its own, started here and
    stopped by :meth:`close`, when the client is dropped unclosed, or at interpreter exit.
    One client may be shared by every thread of a process. After a ``fork`` (a
    ``DataLoader`` worker), make a new one in the child.

    The arguments are ``ReplayClient``'s.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        *,
        timeout_s: float = 30.0,
        max_connections: int = 16,
        retries: int = 3,
        backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
        lean_transport: bool = True,
    ) -> None:
        self._loop = LoopThread("rlreplay-client")
        try:
            self._rb = self._loop.run(
                _replay_client(
                    base_url,
                    api_key,
                    timeout_s=timeout_s,
                    max_connections=max_connections,
                    retries=retries,
                    backoff_s=backoff_s,
                    max_backoff_s=max_backoff_s,
                    transport=transport,
                    lean_transport=lean_transport,
                )
            )
        except BaseException:
            self._loop.close()
            raise
        self._loop.on_close(self._rb.aclose)
        # Holds the loop thread, not the client: dropping the client stops the thread.
        self._finalizer = weakref.finalize(self, self._loop.close)

    @property
    def async_client(self) -> ReplayClient:
        """The ``ReplayClient`` the calls run on; await it only on :attr:`thread`'s loop."""
        return self._rb

    @property
    def thread(self) -> threading.Thread:
        """The ``threading.Thread`` the client's event loop runs on."""
        return self._loop.thread

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
        max_staleness: int | None = None,
        delete_after_ack: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Create a table, or confirm it (:meth:`ReplayClient.create_table`); with no
        ``sampler``, the server's default (uniform), as ``PUT {}``."""
        return self._loop.run(
            self._rb.create_table(
                name,
                sampler=sampler,
                remover=remover,
                max_size=max_size,
                max_times_sampled=max_times_sampled,
                rate_limiter=rate_limiter,
                max_staleness=max_staleness,
                delete_after_ack=delete_after_ack,
            )
        )

    def list_tables(self) -> list[dict[str, Any]]:
        """Every table, each with its config and stats."""
        return self._loop.run(self._rb.list_tables())

    def describe_table(self, name: str) -> dict[str, Any]:
        """A table's config and stats (:meth:`ReplayClient.describe_table`)."""
        return self._loop.run(self._rb.describe_table(name))

    def drop_table(self, name: str) -> None:
        """Delete a table and its data."""
        self._loop.run(self._rb.drop_table(name))

    # --- items ------------------------------------------------------------------------------

    def push(self, table: str, items: Sequence[Mapping[str, Any]], *, wait: bool = False) -> int:
        """Insert or replace items (:meth:`ReplayClient.push`); how many were accepted."""
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
        """Insert or replace items given as columns (:meth:`ReplayClient.push_columns`)."""
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
        """One item, or None when the table holds no such key (:meth:`ReplayClient.get`)."""
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
        """Several items in one request (:meth:`ReplayClient.get_many`)."""
        if layout == "columns":
            return self._loop.run(self._rb.get_many(table, keys, layout="columns"))
        return self._loop.run(self._rb.get_many(table, keys))

    def get_many_packed(self, table: str, keys: Iterable[str]) -> bytes:
        """:meth:`get_many`'s columns, their msgpack answer undecoded."""
        return self._loop.run(self._rb.get_many_packed(table, keys))

    @overload
    def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_ms: int | None = ...,
        include_values: bool = ...,
        layout: Literal["items"] = ...,
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
    ) -> ColumnBatch: ...
    def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_ms: int | None = None,
        include_values: bool = True,
        layout: Layout = "items",
    ) -> list[Item] | ColumnBatch:
        """Sample a batch, with replacement (:meth:`ReplayClient.sample`)."""
        if layout == "columns":
            return self._loop.run(
                self._rb.sample(
                    table,
                    batch_size,
                    timeout_ms=timeout_ms,
                    include_values=include_values,
                    layout="columns",
                )
            )
        return self._loop.run(
            self._rb.sample(table, batch_size, timeout_ms=timeout_ms, include_values=include_values)
        )

    def changes(
        self, table: str, since: int, *, limit: int = 10_000, wait_ms: int = 0
    ) -> dict[str, Any]:
        """The table's changes after event ``since`` (:meth:`ReplayClient.changes`)."""
        return self._loop.run(self._rb.changes(table, since, limit=limit, wait_ms=wait_ms))

    def table_index(self, table: str) -> dict[str, Any]:
        """The table's whole selection state (:meth:`ReplayClient.table_index`)."""
        return self._loop.run(self._rb.table_index(table))

    def update_priorities(self, table: str, priorities: Mapping[str, float]) -> dict[str, int]:
        """Set items' priorities; ``{"updated": n, "missing": m}``."""
        return self._loop.run(self._rb.update_priorities(table, priorities))

    def delete(self, table: str, keys: Iterable[str]) -> int:
        """Delete items; how many deletions the server accepted."""
        return self._loop.run(self._rb.delete(table, keys))

    def snapshot(
        self, tables: Iterable[str] | None = None, *, timeout_s: float = 3600.0
    ) -> dict[str, Any]:
        """Take a snapshot to the server's backup URL (:meth:`ReplayClient.snapshot`)."""
        return self._loop.run(self._rb.snapshot(tables, timeout_s=timeout_s))

    def snapshots(self) -> list[dict[str, Any]]:
        """The complete snapshots at the server's backup URL, newest first."""
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
        thread while the caller works (:meth:`ReplayClient.stream`). Close the iterator, or
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
        """Set fields of existing items' values, keeping the others (:meth:`ReplayClient.patch`)."""
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
        """Claim the oldest items ready for ``task`` under a lease (:meth:`ReplayClient.claim`)."""
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
        """Per-task counts of a rollout table (:meth:`ReplayClient.tasks`)."""
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
        (:meth:`ReplayClient.consume`); closing the iterator releases the lease in hand."""
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
        """Whether the server answers ``GET /healthz`` with 2xx (one attempt, no retries)."""
        return self._loop.run(self._rb.health())


def _same(batch: Any) -> Any:
    return batch
