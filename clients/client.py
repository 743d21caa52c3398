"""The async Python client of one replay server, on httpx with msgpack on the wire.

:class:`ReplayClient` is a façade over parts that each own one concern and take the one
:class:`~rlreplay.clients.requester.Requester` (the connection pool, the retries, the codec
at both ends and the error tree) in their constructors:

- :class:`~rlreplay.clients.tables.Tables`: tables and snapshots;
- :class:`~rlreplay.clients.items.Items`: pushes, pipelined writers, reads, priorities,
  deletes and the change feed;
- :class:`~rlreplay.clients.samples.Samples`: samples of items or windows, and streams;
- :class:`~rlreplay.clients.rollouts.Rollouts`: patches, claims and leases, versions and
  reservations of rollout tables;
- :class:`~rlreplay.clients.episodes.Episodes`: appends, reads and deletes of episodes,
  and window priorities.

Each public method forwards to one part with that part's own signature (a test keeps them
equal) and is documented there. Share one client between the tasks of a process rather than
opening one per task. For ``http://`` servers the pool is
:class:`~rlreplay.clients.transport.LeanTransport`, a small HTTP/1.1 transport on asyncio
streams; ``https://`` servers use httpx's own. Every call speaks msgpack both ways, so NumPy
arrays and torch tensors in values travel as arrays and come back as NumPy arrays,
bit-exactly (:mod:`rlreplay.wire.codec`). The server's errors are raised as the classes of
:mod:`rlreplay.wire.errors`; a server still unreachable after the retries raises
:class:`~rlreplay.wire.errors.Unavailable` (which calls are retried:
:mod:`rlreplay.clients.retry`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, Unpack, overload

import httpx

from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.episode_bodies import EndReason, WindowStart
from rlreplay.clients.episode_writer import EpisodeWriter
from rlreplay.clients.episodes import Episode, Episodes
from rlreplay.clients.items import Items
from rlreplay.clients.requester import Requester
from rlreplay.clients.rollouts import Lease, LeaseBase, Reservation, Rollouts
from rlreplay.clients.samples import Samples
from rlreplay.clients.surface import ClaimOptions, ReplayCalls, WindowOptions
from rlreplay.clients.tables import Tables
from rlreplay.clients.types import Item, Layout
from rlreplay.clients.windows import WindowBatch
from rlreplay.clients.writer import Writer
from rlreplay.wire.episode_schemas import EpisodeStepsRequest
from rlreplay.wire.rollout_scale import DEFAULT_RESERVATION_TTL_S
from rlreplay.wire.schemas import ClaimRequest, ColumnsPushRequest, PushRequest

__all__ = ["ReplayClient"]


class ReplayClient:
    """An async client of one replay server.

    Use it as an async context manager (or call :meth:`aclose`)::

        async with ReplayClient("http://127.0.0.1:8000") as rb:
            await rb.push("default", [{"key": "k", "value": {"obs": np.zeros(4)}}])
            batch = await rb.sample("default", batch_size=32)

    Creating, using and closing a client changes nothing outside it: a trainer that takes
    large batches may also call :func:`rlreplay.tune_malloc` once, on purpose.

    Args:
        base_url: The server's root URL: ``http://host:port``, ``https://...``, or
            ``unix:///path/to.sock`` for a server on this host serving a Unix socket
            (``rlreplay serve --uds``; see :mod:`rlreplay.clients.server_url`).
        api_key: Sent as ``Authorization: Bearer <api_key>`` when given.
        timeout_s: Connect, read, write and pool timeout of one attempt, in seconds. A
            sample's read timeout is stretched past its ``timeout_ms``.
        max_connections: Requests in flight at most, and connections the pool opens at
            most, all kept alive; further calls wait in the client. More is not faster on
            httpx's transport, whose pool spends CPU per connection on every request
            (``python -m bench client``).
        retries: Retries after a failed first attempt (see :mod:`rlreplay.clients.retry`).
        backoff_s: The first retry's backoff bound in seconds; it doubles per retry.
        max_backoff_s: The cap on one backoff wait.
        transport: An httpx transport to use instead of the network (``httpx.MockTransport``,
            ``httpx.ASGITransport``); tests and in-process servers use it.
        lean_transport: With no ``transport`` and an ``http://`` ``base_url``, talk to the
            server through :class:`~rlreplay.clients.transport.LeanTransport` (the default:
            ``stream()`` and large answers cost far less CPU than on httpcore). False uses
            httpx's default transport, as ``https://`` URLs always do; the errors, timeouts
            and retries are the same.
        compression: ``"zstd"``: ask for answers compressed (``Accept-Encoding: zstd``)
            and compress request bodies of 16 KiB and more, for compressible batches over
            a slow link; the server must run with ``--zstd``. None (the default): no
            compression, the fastest on a local or data-centre link.
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
        compression: str | None = None,
    ) -> None:
        self._requester = Requester(
            base_url,
            api_key,
            timeout_s=timeout_s,
            max_connections=max_connections,
            retries=retries,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            transport=transport,
            lean_transport=lean_transport,
            compression=compression,
        )
        self._tables = Tables(self._requester)
        self._items = Items(self._requester)
        self._samples = Samples(self._requester)
        self._rollouts = Rollouts(self._requester)
        self._episodes = Episodes(self._requester)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool; calling it again does nothing."""
        await self._requester.aclose()

    async def health(self) -> bool:
        """Whether the server answers ``GET /healthz`` with 2xx (:meth:`Requester.health
        <rlreplay.clients.requester.Requester.health>`)."""
        return await self._requester.health()

    # --- tables: the Tables part -------------------------------------------------------------

    async def create_table(
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
        """Create a table, or confirm that it exists with this configuration
        (:meth:`Tables.create_table <rlreplay.clients.tables.Tables.create_table>`)."""
        return await self._tables.create_table(
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

    async def list_tables(self) -> list[dict[str, Any]]:
        """Every table, each with its config and stats (:meth:`Tables.list_tables`)."""
        return await self._tables.list_tables()

    async def describe_table(self, name: str) -> dict[str, Any]:
        """A table's config and stats (:meth:`Tables.describe_table`)."""
        return await self._tables.describe_table(name)

    async def drop_table(self, name: str) -> None:
        """Delete a table and its data (:meth:`Tables.drop_table`)."""
        await self._tables.drop_table(name)

    async def snapshot(
        self, tables: Iterable[str] | None = None, *, timeout_s: float = 3600.0
    ) -> dict[str, Any]:
        """Take a snapshot to the server's backup URL (:meth:`Tables.snapshot`)."""
        return await self._tables.snapshot(tables, timeout_s=timeout_s)

    async def snapshots(self) -> list[dict[str, Any]]:
        """The complete snapshots at the server's backup URL (:meth:`Tables.snapshots`)."""
        return await self._tables.snapshots()

    # --- items: the Items part ---------------------------------------------------------------

    async def push(
        self,
        table: str,
        items: Sequence[Mapping[str, Any]],
        *,
        wait: bool = False,
        reservation: str | None = None,
    ) -> int:
        """Insert or replace items (:meth:`Items.push <rlreplay.clients.items.Items.push>`)."""
        return await self._items.push(table, items, wait=wait, reservation=reservation)

    async def push_columns(
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
        """Insert or replace items given as columns, in one request
        (:meth:`Items.push_columns <rlreplay.clients.items.Items.push_columns>`)."""
        return await self._items.push_columns(
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

    def writer(self, table: str, *, max_in_flight: int = 8, batch_items: int = 64) -> Writer:
        """A pipelined writer into ``table`` (:meth:`Items.writer`)."""
        return self._items.writer(table, max_in_flight=max_in_flight, batch_items=batch_items)

    async def get(self, table: str, key: str) -> Item | None:
        """One item, or None (:meth:`Items.get`)."""
        return await self._items.get(table, key)

    @overload
    async def get_many(
        self, table: str, keys: Iterable[str], *, layout: Literal["items"] = ...
    ) -> list[Item | None]: ...
    @overload
    async def get_many(
        self, table: str, keys: Iterable[str], *, layout: Literal["columns"]
    ) -> ColumnBatch: ...
    async def get_many(
        self, table: str, keys: Iterable[str], *, layout: Layout = "items"
    ) -> list[Item | None] | ColumnBatch:
        """Several items in one request, in the order asked (:meth:`Items.get_many`)."""
        return await self._items.get_many(table, keys, layout=layout)

    async def get_many_packed(self, table: str, keys: Iterable[str]) -> bytes:
        """:meth:`get_many`'s columns, their msgpack answer undecoded
        (:meth:`Items.get_many_packed`)."""
        return await self._items.get_many_packed(table, keys)

    async def update_priorities(
        self, table: str, priorities: Mapping[str, float]
    ) -> dict[str, int]:
        """Set items' priorities (:meth:`Items.update_priorities`)."""
        return await self._items.update_priorities(table, priorities)

    async def delete(self, table: str, keys: Iterable[str]) -> int:
        """Delete items (:meth:`Items.delete`)."""
        return await self._items.delete(table, keys)

    async def changes(
        self, table: str, since: int, *, limit: int = 10_000, wait_ms: int = 0
    ) -> dict[str, Any]:
        """The table's changes after event ``since`` (:meth:`Items.changes`)."""
        return await self._items.changes(table, since, limit=limit, wait_ms=wait_ms)

    async def table_index(self, table: str) -> dict[str, Any]:
        """The table's whole selection state (:meth:`Items.table_index`)."""
        return await self._items.table_index(table)

    # --- samples: the Samples part -----------------------------------------------------------

    @overload
    async def sample(
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
    async def sample(
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
    async def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_ms: int | None = ...,
        **window: Unpack[WindowOptions],
    ) -> WindowBatch: ...
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
        """Sample a batch of items, or windows of an episode table
        (:meth:`Samples.sample <rlreplay.clients.samples.Samples.sample>`)."""
        return await self._samples.sample(
            table,
            batch_size,
            timeout_ms=timeout_ms,
            include_values=include_values,
            layout=layout,
            where=where,
            **window,
        )

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
    ) -> AsyncIterator[list[Item]]: ...
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
    ) -> AsyncIterator[ColumnBatch]: ...
    @overload
    def stream(
        self,
        table: str,
        *,
        batch_size: int = ...,
        prefetch: int = ...,
        timeout_ms: int | None = ...,
        **window: Unpack[WindowOptions],
    ) -> AsyncIterator[WindowBatch]: ...
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
        """Sample batches without end, ``prefetch`` requests in flight
        (:meth:`Samples.stream <rlreplay.clients.samples.Samples.stream>`)."""
        return self._samples.stream(
            table,
            batch_size=batch_size,
            prefetch=prefetch,
            timeout_ms=timeout_ms,
            include_values=include_values,
            layout=layout,
            **window,
        )

    # --- rollout tables: the Rollouts part ---------------------------------------------------

    async def patch(
        self,
        table: str,
        items: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
        *,
        wait: bool = False,
    ) -> dict[str, int]:
        """Set fields of existing items' values, keeping the others
        (:meth:`Rollouts.patch <rlreplay.clients.rollouts.Rollouts.patch>`)."""
        return await self._rollouts.patch(table, items, wait=wait)

    async def claim(
        self, table: str, *, partial: bool = False, **options: Unpack[ClaimOptions]
    ) -> Lease:
        """Claim the oldest items ready for a task under a lease (:meth:`Rollouts.claim`)."""
        return await self._rollouts.claim(table, partial=partial, **options)

    def consume(
        self, table: str, *, prefetch: int = 1, **options: Unpack[ClaimOptions]
    ) -> AsyncGenerator[LeaseBase, None]:
        """Leases one after another, ``prefetch`` claims in flight (:meth:`Rollouts.consume`)."""
        return self._rollouts.consume(table, prefetch=prefetch, **options)

    async def set_version(self, table: str, version: int, *, force: bool = False) -> dict[str, int]:
        """Move the table's policy version forward (:meth:`Rollouts.set_version`)."""
        return await self._rollouts.set_version(table, version, force=force)

    async def reserve(
        self,
        table: str,
        count: int,
        *,
        version: int,
        wait_ms: int = 10_000,
        ttl_s: float = DEFAULT_RESERVATION_TTL_S,
    ) -> Reservation:
        """Reserve slots before generating rollouts (:meth:`Rollouts.reserve`)."""
        return await self._rollouts.reserve(
            table, count, version=version, wait_ms=wait_ms, ttl_s=ttl_s
        )

    async def return_reservation(self, table: str, reservation: str) -> int:
        """Return a reservation's unfilled slots (:meth:`Rollouts.return_reservation`)."""
        return await self._rollouts.return_reservation(table, reservation)

    async def tasks(self, table: str) -> dict[str, Any]:
        """Each task's counts and the table's version (:meth:`Rollouts.tasks`)."""
        return await self._rollouts.tasks(table)

    # --- episode tables: the Episodes part ---------------------------------------------------

    async def append_steps(
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
        """Append steps to an episode
        (:meth:`Episodes.append_steps <rlreplay.clients.episodes.Episodes.append_steps>`)."""
        return await self._episodes.append_steps(
            table,
            episode,
            steps,
            start=start,
            priorities=priorities,
            end=end,
            final=final,
            wait=wait,
        )

    def episode_writer(self, table: str, *, max_in_flight: int = 8) -> EpisodeWriter:
        """A pipelined writer of episodes (:meth:`Episodes.episode_writer`)."""
        return self._episodes.episode_writer(table, max_in_flight=max_in_flight)

    async def get_episode(
        self, table: str, episode: str, start: int | None = None, stop: int | None = None
    ) -> Episode | None:
        """An episode's steps, length and end, or None (:meth:`Episodes.get_episode`)."""
        return await self._episodes.get_episode(table, episode, start, stop)

    async def delete_episode(self, table: str, episode: str) -> None:
        """Delete an episode and its steps (:meth:`Episodes.delete_episode`)."""
        await self._episodes.delete_episode(table, episode)

    async def update_window_priorities(
        self, table: str, windows: Iterable[WindowStart], *, eta: float | None = None
    ) -> dict[str, int]:
        """Set the priorities of window starts (:meth:`Episodes.update_window_priorities`)."""
        return await self._episodes.update_window_priorities(table, windows, eta=eta)

    # --- one request of this server, as the sharded client sends its parts ------------------

    async def _push_body(self, table: str, body: PushRequest | ColumnsPushRequest) -> int:
        return await self._items.push_body(table, body)

    async def _append(self, table: str, episode: str, body: EpisodeStepsRequest) -> int:
        return await self._episodes.append_body(table, episode, body)

    async def _claim(self, table: str, body: ClaimRequest) -> Lease:
        return await self._rollouts.claim_body(table, body)

    async def _sample_windows(
        self, table: str, batch_size: int, timeout_ms: int | None, window: WindowOptions
    ) -> WindowBatch:
        return await self._samples.sample_windows(table, batch_size, timeout_ms, window)


if TYPE_CHECKING:  # mypy checks that the client has every shared call, as declared
    _SHARED: type[ReplayCalls] = ReplayClient
