"""The async Python client of the replay service, on httpx with msgpack on the wire.

One :class:`ReplayClient` holds one ``httpx.AsyncClient`` and its connection pool; share it
between the tasks of a process rather than opening one per task. For ``http://`` servers the
pool is :class:`~rlreplay.clients.transport.LeanTransport`, a small HTTP/1.1 transport on
asyncio streams; ``https://`` servers use httpx's own. Every call speaks msgpack both ways,
so NumPy arrays and torch tensors in values travel as arrays and come back as NumPy arrays,
bit-exactly (:mod:`rlreplay.wire.codec`); request bodies are the Structs the server decodes
them with (:mod:`rlreplay.clients.bodies`). The server's errors are raised as the classes of
:mod:`rlreplay.wire.errors`; a server still unreachable after the retries raises
:class:`~rlreplay.wire.errors.Unavailable` (which calls are retried:
:mod:`rlreplay.clients.retry`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, Unpack, overload

import httpx

from rlreplay.clients.bodies import ColumnsMeta, columns_request, push_request
from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.episode_bodies import window_sample
from rlreplay.clients.episodes import EpisodeCalls
from rlreplay.clients.requester import path_segment
from rlreplay.clients.rollouts import new_request_id
from rlreplay.clients.sample_stream import sample_stream
from rlreplay.clients.surface import ReplayCalls, WindowOptions
from rlreplay.clients.table_config import table_config
from rlreplay.clients.types import Item, Layout
from rlreplay.clients.windows import WindowBatch
from rlreplay.clients.writer import Writer
from rlreplay.wire.errors import ItemNotFound
from rlreplay.wire.schemas import (
    DEFAULT_TIMEOUT_MS,
    ColumnsPushRequest,
    DeleteRequest,
    ItemIn,
    KeysRequest,
    PrioritiesRequest,
    PushRequest,
    SampleRequest,
    SnapshotRequest,
)

__all__ = ["ReplayClient"]

_SERVER_SAMPLE_TIMEOUT_S: Final = DEFAULT_TIMEOUT_MS / 1000
_SAMPLE_TIMEOUT_MARGIN_S: Final = 5.0


class ReplayClient(EpisodeCalls):
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

    # --- tables -----------------------------------------------------------------------------

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
        """Create a table, or confirm that it exists with this configuration.

        Args:
            name: The table's name.
            sampler: The sampler's config; the server's default when None (``uniform``, as
                for ``PUT {}`` and the ``default`` table).
            remover: The remover's config; the server's default when None.
            max_size: The capacity, or None for unbounded.
            max_times_sampled: Samples after which an item is deleted (0: unlimited).
            rate_limiter: The rate limiter's config, or None for none.
            max_staleness: Rollouts whose version is below the table's version minus this
                are dropped (None: never).
            delete_after_ack: Tasks whose acknowledgements, all of them, delete an item.
            admission: ``{"max_ahead": n}``: reservations are granted while reserved slots
                plus unconsumed items stay within n (None: every reservation is granted).
            ttl_s: Unconsumed items older than this are deleted, whole groups at a time.
            episodes: Make it an episode table with this config (``{}``, or
                ``{"compression": "zstd", "frame_stack": {"obs": 4}}``): it holds steps
                appended per episode (``append_steps``) and samples windows of them.

        Returns:
            The server's answer (the table's config and stats).

        Raises:
            TableExists: The table exists with a different configuration.
            ValidationFailed: The configuration is invalid.
        """
        config = table_config(
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
        return self._as_dict(
            await self._call("PUT", self._table(name), body=config, idempotent=True)
        )

    async def list_tables(self) -> list[dict[str, Any]]:
        """Every table, each with its config and stats."""
        answer = await self._call("GET", "/v1/tables", idempotent=True)
        tables = answer.get("tables", answer) if isinstance(answer, dict) else answer
        if isinstance(tables, dict):  # {name: description}
            return [{"name": name, **info} for name, info in tables.items()]
        return list(tables or [])

    async def describe_table(self, name: str) -> dict[str, Any]:
        """A table's config and stats (``size``, ``inserts``, ``samples``...).

        Raises:
            TableNotFound: No such table.
        """
        return self._as_dict(await self._call("GET", self._table(name), idempotent=True))

    async def drop_table(self, name: str) -> None:
        """Delete a table and its data.

        Raises:
            TableNotFound: No such table.
        """
        await self._call("DELETE", self._table(name), idempotent=True)

    # --- items ------------------------------------------------------------------------------

    async def push(
        self,
        table: str,
        items: Sequence[Mapping[str, Any]],
        *,
        wait: bool = False,
        reservation: str | None = None,
    ) -> int:
        """Insert or replace items.

        Args:
            table: The table.
            items: ``{"key": str, "value": any, "priority": float (optional)}`` each. Values
                may hold NumPy arrays and torch tensors.
            wait: Answer only once the writer has applied the items.
            reservation: The id of a reservation (:meth:`reserve`) the items fill.

        Returns:
            How many items were accepted (``wait=False``) or committed (``wait=True``); 0
            without a request when ``items`` is empty.

        Raises:
            Overloaded: The write queue stayed full through every retry.
            TableNotFound, ValidationFailed, PayloadTooLarge: As the contract says.
        """
        if not items:
            return 0
        return await self._push_body(table, push_request(items, wait, reservation))

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
        """Insert or replace items given as columns, in one request.

        Item ``i`` is ``keys[i]`` with the value ``{field: columns[field][i], ...}``, stored
        exactly as :meth:`push` would store that value: a row of a column of two axes or more
        is an array, an element of a 1-D column the scalar NumPy gives (a float64, an int,
        a bool; complex and bfloat16 elements are 0-d arrays).

        Args:
            table: The table.
            keys: The items' keys.
            columns: Field -> NumPy array, torch tensor, ``BFloat16Array`` or list, its
                first axis ``len(keys)``.
            priorities: One per key (a sequence or a 1-D array); 1.0 each when None.
            wait: Answer only once the writer has applied the items.
            tags, groups, versions: One entry per key (None where an item has none), as
                :meth:`push`'s items carry them.
            reservation: The reservation whose slots these items fill.

        Returns:
            As :meth:`push`; 0 without a request when ``keys`` is empty.

        Raises:
            ValidationFailed: A column's first axis is not ``len(keys)``, a bad key or
                priority (the message names the field).
            TypeError: A column has no wire form (said before sending).
        """
        meta: ColumnsMeta = {
            "tags": tags,
            "groups": groups,
            "versions": versions,
            "reservation": reservation,
        }
        body = columns_request(keys, columns, priorities, wait, meta)
        if not body.keys:
            return 0
        return await self._push_body(table, body)

    def writer(self, table: str, *, max_in_flight: int = 8, batch_items: int = 64) -> Writer:
        """A pipelined writer into ``table`` (see :class:`~rlreplay.clients.writer.Writer`)::

            async with rb.writer("t", max_in_flight=8, batch_items=64) as w:
                await w.append(key, value, priority)

        Raises:
            TypeError: ``max_in_flight`` or ``batch_items`` is not an int.
            ValueError: ``max_in_flight`` or ``batch_items`` is below 1.
        """

        async def send(items: list[ItemIn]) -> int:
            return await self._push_body(table, PushRequest(items))

        return Writer(send, max_in_flight=max_in_flight, batch_items=batch_items)

    async def _push_body(self, table: str, body: PushRequest | ColumnsPushRequest) -> int:
        body.request_id = new_request_id()  # its retries reuse it: a push applies once
        answer = await self._call("POST", self._table(table, "/items"), body=body, idempotent=True)
        counts = self._as_dict(answer)
        return int(counts.get("committed", counts.get("accepted", 0)))

    async def get(self, table: str, key: str) -> Item | None:
        """One item (``key``, ``value``, ``priority``, ``inserted_at``, ``times_sampled``).

        Returns:
            The item, or None when the table holds no such key.

        Raises:
            TableNotFound: No such table.
        """
        path = self._table(table, "/items/" + path_segment(key, "key"))
        try:
            return self._as_dict(await self._call("GET", path, idempotent=True))
        except ItemNotFound:
            return None

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
        """Several items in one request, in the order asked; None where a key is missing.

        With ``layout="columns"``: a :class:`ColumnBatch` of the items found, each field of
        their values stacked (``missing`` lists the keys not found); values that do not
        stack raise ``ValidationFailed`` naming the field.
        """
        body = KeysRequest(list(keys), layout)
        path = self._table(table, "/items:batchGet")
        columns = layout == "columns"
        answer = self._as_dict(
            await self._call("POST", path, body=body, idempotent=True, views=columns)
        )
        if columns:
            return ColumnBatch.from_answer(answer)
        return list(answer.get("items", []))

    async def get_many_packed(self, table: str, keys: Iterable[str]) -> bytes:
        """:meth:`get_many` with ``layout="columns"``, its msgpack answer left undecoded, for
        a caller that decodes the arrays straight into buffers of its own (the GPU sidecar).
        """
        body = KeysRequest(list(keys), "columns")
        path = self._table(table, "/items:batchGet")
        packed: bytes = await self._call("POST", path, body=body, idempotent=True, raw=True)
        return packed

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
                stacked along a new first axis, no per-item objects.
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
            return await self._sample_windows(table, batch_size, timeout_ms, window)
        body = SampleRequest(
            batch_size,
            DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms,
            include_values,
            layout,
        )
        if where is not None:
            body.where = dict(where)
        waits_s = (timeout_ms / 1000) if timeout_ms is not None else _SERVER_SAMPLE_TIMEOUT_S
        answer = await self._call(
            "POST",
            self._table(table, "/sample"),
            body=body,
            idempotent=False,
            read_timeout_s=max(self._timeout_s, waits_s + _SAMPLE_TIMEOUT_MARGIN_S),
            views=layout == "columns",
        )
        if layout == "columns":
            return ColumnBatch.from_answer(answer)
        return list(self._as_dict(answer).get("items", []))

    async def changes(
        self, table: str, since: int, *, limit: int = 10_000, wait_ms: int = 0
    ) -> dict[str, Any]:
        """The table's changes after event ``since`` (a long poll of up to ``wait_ms``).

        Returns:
            ``{"seq", "epoch", "events": [{"seq", "op", "key", "priority", "inserted_at"}]}``.

        Raises:
            Gone: ``since`` is older than the server keeps, or of another ``epoch``: reload
                with :meth:`table_index`.
        """
        path = self._table(table, f"/changes?since={since}&limit={limit}&wait_ms={wait_ms}")
        read_s = max(self._timeout_s, wait_ms / 1000 + _SAMPLE_TIMEOUT_MARGIN_S)
        answer = await self._call("GET", path, idempotent=True, read_timeout_s=read_s)
        return self._as_dict(answer)

    async def table_index(self, table: str) -> dict[str, Any]:
        """The table's whole selection state: ``{"seq", "epoch", "keys", "priorities",
        "inserted_at"}`` (NumPy columns), oldest insert first, as of event ``seq``."""
        return self._as_dict(await self._call("GET", self._table(table, "/index"), idempotent=True))

    async def update_priorities(
        self, table: str, priorities: Mapping[str, float]
    ) -> dict[str, int]:
        """Set items' priorities.

        Returns:
            ``{"updated": n, "missing": m}``: keys not in the table are skipped and counted.
        """
        body = PrioritiesRequest({key: float(value) for key, value in priorities.items()})
        path = self._table(table, "/priorities")
        answer = self._as_dict(await self._call("POST", path, body=body, idempotent=True))
        return {"updated": int(answer.get("updated", 0)), "missing": int(answer.get("missing", 0))}

    async def delete(self, table: str, keys: Iterable[str]) -> int:
        """Delete items; keys not in the table are ignored.

        Returns:
            How many deletions the server accepted; 0 without a request when ``keys`` is empty.
        """
        body = DeleteRequest(list(keys), False, new_request_id())
        if not body.keys:
            return 0
        path = self._table(table, "/items:batchDelete")
        answer = self._as_dict(await self._call("POST", path, body=body, idempotent=True))
        return int(answer.get("accepted", 0))

    async def snapshot(
        self, tables: Iterable[str] | None = None, *, timeout_s: float = 3600.0
    ) -> dict[str, Any]:
        """Take a snapshot to the server's backup URL; returns once it is uploaded.

        Returns:
            ``{"id", "url", "created_at", "items", "bytes", "tables"}``.

        Raises:
            NotConfigured: The server has no ``--backup-url``.
            TableNotFound: ``tables`` names a table that does not exist.
        """
        body = SnapshotRequest(None if tables is None else list(tables))
        answer = await self._call(
            "POST", "/v1/snapshots", body=body, idempotent=False, read_timeout_s=timeout_s
        )
        return self._as_dict(answer)

    async def snapshots(self) -> list[dict[str, Any]]:
        """The complete snapshots at the server's backup URL, newest first."""
        answer = self._as_dict(await self._call("GET", "/v1/snapshots", idempotent=True))
        return list(answer.get("snapshots", []))

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

    # --- service ----------------------------------------------------------------------------

    async def health(self) -> bool:
        """Whether the server answers ``GET /healthz`` with 2xx (one attempt, no retries).

        Raises:
            WrongEventLoop: Called from another event loop than the client's first call.
        """
        self._on_own_loop()
        try:
            response = await self._http.get("/healthz")
        except httpx.HTTPError:
            return False
        return response.is_success


if TYPE_CHECKING:  # mypy checks that the client has every shared call, as declared
    _SHARED: type[ReplayCalls] = ReplayClient
