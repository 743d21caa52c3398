"""The shared calls of the synchronous clients, written once for both.

:class:`BlockingCalls` runs an async client (one that has
:class:`~rlreplay.clients.surface.ReplayCalls`) on a
:class:`~rlreplay.clients.loop_thread.LoopThread` of its own, and gives each shared call a
blocking form with the same parameters: :class:`~rlreplay.clients.sync_client.Client` runs
a ``ReplayClient`` so, :class:`~rlreplay.clients.sync_sharded.ShardedClient` a
``ShardedReplayClient``. Each adds the calls only its async client has.
``writer()``, ``stream()``, ``claim()`` and ``consume()`` return blocking forms of what the
async calls return.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeVar, Unpack, overload

from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.episode_bodies import EndReason, WindowStart, window_sample
from rlreplay.clients.episodes import Episode
from rlreplay.clients.loop_thread import LoopThread
from rlreplay.clients.rollouts import LeaseBase, Reservation
from rlreplay.clients.surface import ClaimOptions, ReplayCalls, WindowOptions
from rlreplay.clients.sync_episode_writer import SyncEpisodeWriter
from rlreplay.clients.sync_lease import SyncLease
from rlreplay.clients.sync_stream import SyncStream
from rlreplay.clients.sync_writer import SyncWriter
from rlreplay.clients.types import Item, Layout
from rlreplay.clients.windows import WindowBatch

__all__ = ["BlockingCalls"]

A = TypeVar("A", bound=ReplayCalls)


class BlockingCalls(Generic[A]):
    """An async client on a loop thread of its own, and the shared calls made blocking.

    The thread is started here and stopped by :meth:`close`, when the client is dropped
    unclosed, or at interpreter exit.

    Args:
        thread_name: The loop thread's name.
        make: Makes the async client; it is called on the loop thread, which then owns
            the client's connections.
    """

    def __init__(self, thread_name: str, make: Callable[[], A]) -> None:
        self._loop = LoopThread(thread_name)

        async def made() -> A:
            return make()

        try:
            self._rb: A = self._loop.run(made())
        except BaseException:
            self._loop.close()
            raise
        self._loop.on_close(self._rb.aclose)
        # Holds the loop thread, not the client: dropping the client stops the thread.
        self._finalizer = weakref.finalize(self, self._loop.close)

    @property
    def async_client(self) -> A:
        """The async client the calls run on; await it only on :attr:`thread`'s loop."""
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
        admission: Mapping[str, Any] | None = None,
        ttl_s: float | None = None,
        episodes: Mapping[str, Any] | None = None,
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
                admission=admission,
                ttl_s=ttl_s,
                episodes=episodes,
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

    def push(
        self,
        table: str,
        items: Sequence[Mapping[str, Any]],
        *,
        wait: bool = False,
        reservation: str | None = None,
    ) -> int:
        """Insert or replace items (:meth:`ReplayClient.push`); how many were accepted."""
        return self._loop.run(self._rb.push(table, items, wait=wait, reservation=reservation))

    def push_columns(
        self,
        table: str,
        keys: Sequence[str],
        columns: Mapping[str, Any],
        *,
        priorities: Any = None,
        wait: bool = False,
        tags: Sequence[Mapping[str, Any] | None] | None = None,
        groups: Sequence[str | None] | None = None,
        versions: Sequence[int | None] | None = None,
        reservation: str | None = None,
    ) -> int:
        """Insert or replace items given as columns (:meth:`ReplayClient.push_columns`)."""
        return self._loop.run(
            self._rb.push_columns(
                table,
                keys,
                columns,
                priorities=priorities,
                wait=wait,
                tags=tags,
                groups=groups,
                versions=versions,
                reservation=reservation,
            )
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
        """Several items, in the order asked (:meth:`ReplayClient.get_many`)."""
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
        where: Mapping[str, Any] | None = ...,
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
    ) -> ColumnBatch: ...
    @overload
    def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_ms: int | None = ...,
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
        **window: Unpack[WindowOptions],
    ) -> list[Item] | ColumnBatch | WindowBatch:
        """Sample a batch, with replacement, or windows of an episode table given window
        options (:meth:`ReplayClient.sample`)."""
        if window_sample(window, layout, include_values):
            return self._loop.run(
                self._rb.sample(table, batch_size, timeout_ms=timeout_ms, **window)
            )
        if layout == "columns":
            return self._loop.run(
                self._rb.sample(
                    table,
                    batch_size,
                    timeout_ms=timeout_ms,
                    include_values=include_values,
                    layout="columns",
                    where=where,
                )
            )
        return self._loop.run(
            self._rb.sample(
                table, batch_size, timeout_ms=timeout_ms, include_values=include_values, where=where
            )
        )

    def update_priorities(self, table: str, priorities: Mapping[str, float]) -> dict[str, int]:
        """Set items' priorities; ``{"updated": n, "missing": m}``."""
        return self._loop.run(self._rb.update_priorities(table, priorities))

    def delete(self, table: str, keys: Iterable[str]) -> int:
        """Delete items; how many deletions the server accepted."""
        return self._loop.run(self._rb.delete(table, keys))

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
    @overload
    def stream(
        self,
        table: str,
        *,
        batch_size: int = ...,
        prefetch: int = ...,
        timeout_ms: int | None = ...,
        **window: Unpack[WindowOptions],
    ) -> SyncStream[WindowBatch]: ...
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
    ) -> SyncStream[list[Item]] | SyncStream[ColumnBatch] | SyncStream[WindowBatch]:
        """Sampled batches without end, ``prefetch`` requests kept in flight on the loop
        thread while the caller works (:meth:`ReplayClient.stream`). Close the iterator, or
        use it in a ``with`` block, to cancel them::

            with rb.stream("t", batch_size=64) as batches:
                for batch in batches:
                    ...
        """
        if window_sample(window, layout, include_values):
            windows = self._rb.stream(
                table, batch_size=batch_size, prefetch=prefetch, timeout_ms=timeout_ms, **window
            )
            return SyncStream(self._loop, windows, _same)
        batches = self._rb.stream(
            table,
            batch_size=batch_size,
            prefetch=prefetch,
            timeout_ms=timeout_ms,
            include_values=include_values,
            layout=layout,
        )
        return SyncStream(self._loop, batches, _same)

    # --- episode tables ---------------------------------------------------------------------

    def append_steps(
        self,
        table: str,
        episode: str,
        steps: Mapping[str, Any],
        *,
        start: int,
        priorities: Any = None,
        end: EndReason | None = None,
        final: Mapping[str, Any] | None = None,
        wait: bool = False,
    ) -> int:
        """Append steps to an episode (:meth:`ReplayClient.append_steps`); how many were
        accepted."""
        return self._loop.run(
            self._rb.append_steps(
                table,
                episode,
                steps,
                start=start,
                priorities=priorities,
                end=end,
                final=final,
                wait=wait,
            )
        )

    def get_episode(
        self, table: str, episode: str, start: int | None = None, stop: int | None = None
    ) -> Episode | None:
        """An episode's steps, length and end, or None (:meth:`ReplayClient.get_episode`)."""
        return self._loop.run(self._rb.get_episode(table, episode, start, stop))

    def delete_episode(self, table: str, episode: str) -> None:
        """Delete an episode and its steps (:meth:`ReplayClient.delete_episode`)."""
        self._loop.run(self._rb.delete_episode(table, episode))

    def episode_writer(self, table: str, *, max_in_flight: int = 8) -> SyncEpisodeWriter:
        """A pipelined episode writer
        (:class:`~rlreplay.clients.sync_episode_writer.SyncEpisodeWriter`)."""
        return SyncEpisodeWriter(
            self._loop, self._rb.episode_writer(table, max_in_flight=max_in_flight)
        )

    def update_window_priorities(
        self, table: str, windows: Iterable[WindowStart], *, eta: float | None = None
    ) -> dict[str, int]:
        """Set window starts' priorities (:meth:`ReplayClient.update_window_priorities`)."""
        return self._loop.run(self._rb.update_window_priorities(table, windows, eta=eta))

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
        self, table: str, *, partial: bool = False, **options: Unpack[ClaimOptions]
    ) -> SyncLease:
        """Claim items ready for a task under a lease (:meth:`ReplayClient.claim`)."""
        lease = self._loop.run(self._rb.claim(table, partial=partial, **options))
        return SyncLease(self._loop, lease)

    def set_version(self, table: str, version: int, *, force: bool = False) -> dict[str, int]:
        """Move the table's policy version forward; ``{"version", "dropped_stale"}``
        (``force``: see ``ReplayClient.set_version``)."""
        return self._loop.run(self._rb.set_version(table, version, force=force))

    def tasks(self, table: str) -> dict[str, Any]:
        """Per-task counts of a rollout table (:meth:`ReplayClient.tasks`)."""
        return self._loop.run(self._rb.tasks(table))

    def reserve(
        self, table: str, count: int, *, version: int, wait_ms: int = 10_000, ttl_s: float = 600.0
    ) -> Reservation:
        """Reserve slots before generating (:meth:`ReplayClient.reserve`)."""
        return self._loop.run(
            self._rb.reserve(table, count, version=version, wait_ms=wait_ms, ttl_s=ttl_s)
        )

    def return_reservation(self, table: str, reservation: str) -> int:
        """Return a reservation's unfilled slots (:meth:`ReplayClient.return_reservation`)."""
        return self._loop.run(self._rb.return_reservation(table, reservation))

    def consume(
        self, table: str, *, prefetch: int = 1, **options: Unpack[ClaimOptions]
    ) -> SyncStream[SyncLease]:
        """Leases one after another, each acknowledged when the next is asked for
        (:meth:`ReplayClient.consume`); closing the iterator releases the lease in hand."""
        leases = self._rb.consume(table, prefetch=prefetch, **options)
        loop = self._loop

        def blocking(lease: LeaseBase) -> SyncLease:
            return SyncLease(loop, lease)

        return SyncStream(loop, leases, blocking)

    # --- service ----------------------------------------------------------------------------

    def health(self) -> bool:
        """Whether the server (every server, when sharded) answers ``GET /healthz`` with 2xx."""
        return self._loop.run(self._rb.health())


def _same(batch: Any) -> Any:
    return batch
