"""A client of several replay servers that spreads each table's items over them.

Each key belongs to one server, chosen by rendezvous hashing of the key over the servers'
URLs (:mod:`rlreplay.clients.rendezvous`): a push, get, batchGet, delete or priority update
is split by owner and the parts are sent concurrently, and the answers are put back in the
order asked (keys sharing a ``{tag}`` share a server). Table calls go to every server. The
servers' clients and that split are a :class:`~rlreplay.clients.shard_fan_out.ShardFanOut`,
which the rollout calls' part (:class:`~rlreplay.clients.sharded_rollouts.ShardedRollouts`)
shares. A sample stays exact: it splits the batch by each shard's ``draw_mass``, samples the
shards concurrently and reports each pick's probability and weight as one server would
(:mod:`rlreplay.clients.shard_merge`).

Per shard, not global: ``max_size``, ``max_times_sampled``, rate limiters, the order of the
deterministic samplers, snapshots (docs/deployment.md, "Scaling out", lists them all).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, Unpack, overload

import numpy as np

from rlreplay.clients.bodies import ColumnsMeta
from rlreplay.clients.client import ReplayClient
from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.episode_bodies import EndReason, WindowStart, window_sample
from rlreplay.clients.episode_writer import EpisodeWriter
from rlreplay.clients.episodes import Episode
from rlreplay.clients.rendezvous import Rendezvous, normalized_url
from rlreplay.clients.rollouts import LeaseBase, Reservation
from rlreplay.clients.sample_stream import sample_stream
from rlreplay.clients.shard_fan_out import ShardFanOut
from rlreplay.clients.shard_merge import (
    Part,
    assemble_sample,
    merge_columns,
    merged_description,
)
from rlreplay.clients.sharded_episodes import ShardedEpisodes
from rlreplay.clients.sharded_reservations import (
    push_columns_spread,
    push_spread,
    reserve_sharded,
    return_sharded,
)
from rlreplay.clients.sharded_rollouts import ShardedLease, ShardedRollouts
from rlreplay.clients.sharded_sampling import ShardedDraw
from rlreplay.clients.sharded_tables import drop_everywhere, merged_tables
from rlreplay.clients.sharded_where import sample_where
from rlreplay.clients.surface import ClaimOptions, ReplayCalls, WindowOptions
from rlreplay.clients.types import Item, Layout
from rlreplay.clients.windows import WindowBatch
from rlreplay.clients.writer import Writer
from rlreplay.wire.errors import ValidationFailed
from rlreplay.wire.schemas import ItemIn, PushRequest

__all__ = ["ShardedReplayClient"]


class ShardedReplayClient:
    """An async client of several replay servers, each table spread over all of them.

    Use it as an async context manager (or call :meth:`aclose`)::

        urls = ["http://replay-0:8000", "http://replay-1:8000", "http://replay-2:8000"]
        async with ShardedReplayClient(urls) as rb:
            await rb.create_table("default", sampler={"type": "uniform"})
            await rb.push("default", [{"key": "k", "value": {"obs": np.zeros(4)}}])
            batch = await rb.sample("default", batch_size=32)

    It has :class:`ReplayClient`'s calls and answers, but for the snapshot calls (one
    answer per server) and ``sample``'s ``allow_partial``.

    Args:
        urls: The servers' root URLs; every client of these tables must name the same ones
            (the order does not matter).
        api_key: Sent to every server as ``Authorization: Bearer <api_key>``.
        allow_partial: The default of :meth:`sample`'s ``allow_partial``: sample from the
            servers that answer when some do not, instead of raising ``Unavailable``.
        seed: Seeds the split of sample batches between servers (random when None).
        shard_names: What each server is called in the hashing, one per URL (their
            normalized URLs when None): names let clients that reach the servers by other
            URLs (a port-forward, DNS names in the cluster) agree on who holds a key.
        **options: Passed to each server's :class:`ReplayClient` (``timeout_s``,
            ``max_connections``, ``retries``...).

    Raises:
        ValueError: No URL, the same server named twice, or ``shard_names`` not one per URL.
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
        if isinstance(urls, str):
            raise TypeError("urls must be a list of server URLs, not one string")
        self.urls = [normalized_url(url) for url in urls]
        names = self.urls if shard_names is None else list(shard_names)
        if len(names) != len(self.urls):
            raise ValueError(f"{len(names)} shard_names for {len(self.urls)} URLs")
        self._fan_out = ShardFanOut(
            self.urls,
            [ReplayClient(url, api_key, **options) for url in self.urls],
            ring=Rendezvous(names),
        )
        self._rng = np.random.default_rng(seed)
        self._allow_partial = allow_partial
        self._draw = ShardedDraw(self._fan_out, allow_partial=allow_partial, rng=self._rng)
        self._rollouts = ShardedRollouts(self._fan_out, allow_partial=allow_partial, rng=self._rng)
        self._episodes = ShardedEpisodes(self._fan_out, self._draw)

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
        """Close every server's connection pool; calling it again does nothing."""
        await asyncio.gather(*(shard.aclose() for shard in self._fan_out.shards))

    def owner(self, key: str) -> str:
        """The URL of the server that holds ``key``."""
        return self.urls[self._fan_out.split([key]).popitem()[0]]

    # --- tables ---------------------------------------------------------------------------

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
        """Create the table on every server, or confirm it (``ReplayClient.create_table``).

        ``max_size``, ``max_times_sampled``, the rate limiter and ``max_staleness`` apply to
        each server's part of the table. Answers as :meth:`describe_table`.
        """
        return merged_description(
            self.urls,
            await self._fan_out.every(
                lambda c: c.create_table(
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
            ),
        )

    async def describe_table(self, name: str) -> dict[str, Any]:
        """The table's config and its stats summed over the servers; ``shards`` holds each
        server's stats by URL.

        Raises:
            TableNotFound: A server has no such table.
        """
        return merged_description(
            self.urls, await self._fan_out.every(lambda c: c.describe_table(name))
        )

    async def list_tables(self) -> list[dict[str, Any]]:
        """Every table any server has, each as :meth:`describe_table` gives it."""
        return merged_tables(self.urls, await self._fan_out.every(lambda c: c.list_tables()))

    async def drop_table(self, name: str) -> None:
        """Delete the table and its data on every server.

        Raises:
            TableNotFound: No server had such a table.
        """
        await drop_everywhere(self._fan_out, name)

    # --- items ----------------------------------------------------------------------------

    async def push(
        self,
        table: str,
        items: Sequence[Mapping[str, Any]],
        *,
        wait: bool = False,
        reservation: str | None = None,
    ) -> int:
        """Insert or replace items, each on its key's server (``ReplayClient.push``).

        A server that fails fails the call; the parts other servers took stay (pushing
        again is safe: a key's item is replaced).
        """
        return await push_spread(self._fan_out, table, items, wait, reservation)

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
        """Insert or replace items given as columns (``ReplayClient.push_columns``); each
        server gets the rows of its keys (``push_columns_spread``)."""
        meta = ColumnsMeta(tags=tags, groups=groups, versions=versions, reservation=reservation)
        return await push_columns_spread(
            self._fan_out, table, keys, columns, priorities, wait, meta
        )

    def writer(self, table: str, *, max_in_flight: int = 8, batch_items: int = 64) -> Writer:
        """A pipelined writer (``ReplayClient.writer``, errors included); each batch is
        split by server."""

        async def send(items: list[ItemIn]) -> int:
            groups = self._fan_out.split([item.key for item in items])
            calls = {
                s: self._fan_out.shards[s]._push_body(
                    table, PushRequest([items[i] for i in places.tolist()])
                )
                for s, places in groups.items()
            }
            return sum((await self._fan_out.each(calls)).values())

        return Writer(send, max_in_flight=max_in_flight, batch_items=batch_items)

    async def get(self, table: str, key: str) -> Item | None:
        """One item from its server, or None (``ReplayClient.get``)."""
        shard = self._fan_out.split([key]).popitem()[0]
        return await self._fan_out.on(shard, self._fan_out.shards[shard].get(table, key))

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
        """Several items from their servers, in the order asked (``ReplayClient.get_many``)."""
        keys = list(keys)
        groups = self._fan_out.split(keys)
        if layout == "items":
            calls = {
                s: self._fan_out.shards[s].get_many(table, [keys[i] for i in places.tolist()])
                for s, places in groups.items()
            }
            found: list[Item | None] = [None] * len(keys)
            for s, items in (await self._fan_out.each(calls)).items():
                for place, item in zip(groups[s].tolist(), items, strict=True):
                    found[place] = item
            return found
        column_calls = {
            s: self._fan_out.shards[s].get_many(
                table, [keys[i] for i in places.tolist()], layout="columns"
            )
            for s, places in groups.items()
        }
        batches = await self._fan_out.each(column_calls)
        missing = {key for batch in batches.values() for key in batch.missing}
        # the rows found, numbered in the order asked
        rank = np.cumsum([key not in missing for key in keys]) - 1
        parts: list[Part] = []
        for s, batch in batches.items():
            places = groups[s]
            kept = np.array([keys[i] not in missing for i in places.tolist()], dtype=bool)
            parts.append((batch, np.asarray(rank[places[kept]], dtype=np.intp)))
        return merge_columns(
            parts,
            len(keys) - len(missing),
            missing=[key for key in keys if key in missing],
        )

    async def update_priorities(
        self, table: str, priorities: Mapping[str, float]
    ) -> dict[str, int]:
        """Set items' priorities on their servers (``ReplayClient.update_priorities``)."""
        keys = list(priorities)
        calls = {
            s: self._fan_out.shards[s].update_priorities(
                table, {keys[i]: priorities[keys[i]] for i in places.tolist()}
            )
            for s, places in self._fan_out.split(keys).items()
        }
        answers = (await self._fan_out.each(calls)).values()
        return {n: sum(a[n] for a in answers) for n in ("updated", "missing")}

    async def delete(self, table: str, keys: Iterable[str]) -> int:
        """Delete items on their servers (``ReplayClient.delete``)."""
        keys = list(keys)
        calls = {
            s: self._fan_out.shards[s].delete(table, [keys[i] for i in places.tolist()])
            for s, places in self._fan_out.split(keys).items()
        }
        return sum((await self._fan_out.each(calls)).values())

    # --- sampling -------------------------------------------------------------------------

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
        allow_partial: bool | None = ...,
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
        allow_partial: bool | None = ...,
    ) -> ColumnBatch: ...
    @overload
    async def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout_ms: int | None = ...,
        allow_partial: bool | None = ...,
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
        allow_partial: bool | None = None,
        **window: Unpack[WindowOptions],
    ) -> list[Item] | ColumnBatch | WindowBatch:
        """Sample a batch over every server, as one server holding every item would.

        Drawn as :mod:`rlreplay.clients.sharded_sampling` says: each item's ``probability``
        and prioritized ``weight`` are one server's figures; picks stay in the order drawn.

        Args:
            table, batch_size, timeout_ms, include_values, layout, where: As
                ``ReplayClient.sample`` (shares of ``where``'s matches: ``sharded_where``).
            allow_partial: When a server cannot be reached, sample from the others (the
                probabilities are then those of the items they hold) rather than raise;
                the client's default when None.
            **window: Window options: windows of an episode table, drawn over the servers
                (:mod:`rlreplay.clients.sharded_episodes` says how).

        Raises:
            Unavailable: A server cannot be reached (the message names it), or, with
                ``allow_partial``, none can.
            DeadlineExceeded: No server held an item within ``timeout_ms``, or a server's
                rate limiter held its part past it.
        """
        if window_sample(window, layout, include_values):
            return await self._episodes.sample(table, batch_size, timeout_ms, allow_partial, window)
        if batch_size < 1:
            raise ValidationFailed(f"batch_size ({batch_size}) must be >= 1")
        if where is not None:  # see ``sharded_where``
            partial = self._allow_partial if allow_partial is None else allow_partial
            return await sample_where(
                self._fan_out,
                self._rng,
                table,
                batch_size,
                where,
                timeout_ms=timeout_ms,
                include_values=include_values,
                layout=layout,
                partial=partial,
            )
        if len(self._fan_out.shards) == 1:  # its share is the whole table: no need to ask
            call = self._fan_out.shards[0].sample(
                table,
                batch_size,
                timeout_ms=timeout_ms,
                include_values=include_values,
                layout=layout,
            )
            return await self._fan_out.on(0, call)

        async def part(s: int, n: int) -> Any:
            return await self._fan_out.shards[s].sample(
                table, n, timeout_ms=timeout_ms, include_values=include_values, layout=layout
            )

        answers, share, beta = await self._draw.draw(
            table, batch_size, part, timeout_ms=timeout_ms, allow_partial=allow_partial
        )
        return assemble_sample(answers, share, beta, batch_size, layout)

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
        """Sharded samples without end, ``prefetch`` in flight (``ReplayClient.stream``)."""
        return sample_stream(
            self.sample,
            table,
            batch_size=batch_size,
            prefetch=prefetch,
            timeout_ms=timeout_ms,
            include_values=include_values,
            layout=layout,
            window=window,
        )

    # --- rollouts: the calls of the ShardedRollouts part -----------------------------------

    async def patch(
        self,
        table: str,
        items: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
        *,
        wait: bool = False,
    ) -> dict[str, int]:
        """Set fields of existing items' values on their servers (``ShardedRollouts.patch``)."""
        return await self._rollouts.patch(table, items, wait=wait)

    async def set_version(self, table: str, version: int, *, force: bool = False) -> dict[str, int]:
        """Set the policy version on every server (``ShardedRollouts.set_version``)."""
        return await self._rollouts.set_version(table, version, force=force)

    async def tasks(self, table: str) -> dict[str, Any]:
        """Each task's counts summed over the servers (``ShardedRollouts.tasks``)."""
        return await self._rollouts.tasks(table)

    async def reserve(
        self, table: str, count: int, *, version: int, wait_ms: int = 10_000, ttl_s: float = 600.0
    ) -> Reservation:
        """Slots on every server, ``count`` spread over them (``reserve_sharded``)."""
        return await reserve_sharded(self._fan_out, table, count, version, wait_ms, ttl_s)

    async def return_reservation(self, table: str, reservation: str) -> int:
        """Each server's unfilled slots of a sharded reservation (``return_sharded``)."""
        return await return_sharded(self._fan_out, table, reservation)

    async def claim(
        self, table: str, *, partial: bool = False, **options: Unpack[ClaimOptions]
    ) -> ShardedLease:
        """Claim up to ``batch_size`` items ready for ``task`` across the servers
        (``ShardedRollouts.claim``)."""
        return await self._rollouts.claim(table, partial=partial, **options)

    def consume(
        self, table: str, *, prefetch: int = 1, **options: Unpack[ClaimOptions]
    ) -> AsyncGenerator[LeaseBase, None]:
        """Sharded leases one after another, ``prefetch`` claims in flight
        (``ShardedRollouts.consume``)."""
        return self._rollouts.consume(table, prefetch=prefetch, **options)

    # --- episodes: the calls of the ShardedEpisodes part ------------------------------------

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
        """Append steps to an episode on its server (``ReplayClient.append_steps``)."""
        return await self._episodes.append_steps(
            table, episode, steps, start, priorities, end, final, wait
        )

    async def get_episode(
        self, table: str, episode: str, start: int | None = None, stop: int | None = None
    ) -> Episode | None:
        """An episode from its server, or None (``ReplayClient.get_episode``)."""
        return await self._episodes.get_episode(table, episode, start, stop)

    async def delete_episode(self, table: str, episode: str) -> None:
        """Delete an episode on its server (``ReplayClient.delete_episode``)."""
        await self._episodes.delete_episode(table, episode)

    def episode_writer(self, table: str, *, max_in_flight: int = 8) -> EpisodeWriter:
        """A pipelined episode writer, each append sent to its episode's server
        (``ReplayClient.episode_writer``)."""
        return self._episodes.episode_writer(table, max_in_flight=max_in_flight)

    async def update_window_priorities(
        self, table: str, windows: Iterable[WindowStart], *, eta: float | None = None
    ) -> dict[str, int]:
        """Set window starts' priorities on their episodes' servers
        (``ReplayClient.update_window_priorities``)."""
        return await self._episodes.update_window_priorities(table, windows, eta=eta)

    # --- service --------------------------------------------------------------------------

    async def snapshot(
        self, tables: Iterable[str] | None = None, *, timeout_s: float = 3600.0
    ) -> dict[str, dict[str, Any]]:
        """A snapshot on every server, each to its own backup URL: answers by server URL."""
        names = None if tables is None else list(tables)
        answers = await self._fan_out.every(lambda c: c.snapshot(names, timeout_s=timeout_s))
        return dict(zip(self.urls, answers, strict=True))

    async def snapshots(self) -> dict[str, list[dict[str, Any]]]:
        """Each server's snapshots, newest first, by server URL."""
        return dict(zip(self.urls, await self._fan_out.every(lambda c: c.snapshots()), strict=True))

    async def health(self) -> bool:
        """Whether every server answers ``GET /healthz`` with 2xx."""
        return all(await asyncio.gather(*(shard.health() for shard in self._fan_out.shards)))


if TYPE_CHECKING:  # mypy checks that the sharded client has every shared call, as declared
    _SHARED: type[ReplayCalls] = ShardedReplayClient
