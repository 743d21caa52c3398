"""The calls every async client has, declared once, and the options of a claim.

:class:`ReplayCalls` is what :class:`~rlreplay.clients.client.ReplayClient` (one server) and
:class:`~rlreplay.clients.sharded.ShardedReplayClient` (several) both answer, with the same
parameters and answers: code written against it runs on either. mypy checks each client
against it (the ``type[ReplayCalls]`` assignment at the end of each client's module), and
``tests/clients/test_surface.py`` checks at run time that every client, the synchronous
ones included, has each call with exactly these parameters. A call one client has and the
other has not (``changes``, ``owner``) or answers in another shape (``snapshot``: one answer,
or one per server) is not part of it.

:class:`ClaimOptions` are the keyword arguments of ``claim`` and ``consume``, in every
client: one declaration, whose defaults are those of the wire's
:class:`~rlreplay.wire.schemas.ClaimRequest`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, Required, TypedDict, Unpack, overload

if TYPE_CHECKING:
    from rlreplay.clients.columns import ColumnBatch
    from rlreplay.clients.episode_bodies import EndReason, WindowStart
    from rlreplay.clients.episode_writer import EpisodeWriter
    from rlreplay.clients.episodes import Episode
    from rlreplay.clients.rollouts import LeaseBase, Reservation
    from rlreplay.clients.types import Item, Layout
    from rlreplay.clients.windows import WindowBatch
    from rlreplay.clients.writer import Writer

__all__ = ["ClaimOptions", "ReplayCalls", "WindowOptions"]


class ClaimOptions(TypedDict, total=False):
    """What a claim asks for: the keyword arguments of ``claim`` and ``consume``.

    Attributes:
        task: The task the items are handed to (required).
        batch_size: How many items (required).
        fields: Hand out only items whose values have all of these fields, and only these
            fields of them; every item, whole, when None.
        group_size: Hand out whole groups of this many items (None: items one by one).
        lease_s: Seconds until the server releases what is not acknowledged (60).
        wait_ms: How long the server waits for ``batch_size`` ready items (10,000).
        min_version: Hand out only items of this policy version or later (None: any).
        where: Hand out only items whose tags meet every condition: ``{tag: value |
            {"in": [...]} | {"gte"?, "gt"?, "lte"?, "lt"?}}``.
        select: The fields returned in values (default: ``fields``, or whole values).
        values: False: no values, each returned field's length in ``lengths`` instead.
        max_tokens: Hand out items while the lengths of ``length_field`` sum within this.
        length_field: The field whose length ``max_tokens`` and ``world_size`` count.
        world_size: Split the items into this many ranks (the lease's ``ranks``).
    """

    task: Required[str]
    batch_size: Required[int]
    fields: Sequence[str] | None
    group_size: int | None
    lease_s: float
    wait_ms: int
    min_version: int | None
    where: Mapping[str, Any] | None
    select: Sequence[str] | None
    values: bool
    max_tokens: int | None
    length_field: str | None
    world_size: int | None


class WindowOptions(TypedDict, total=False):
    """What a window sample asks for: the keyword arguments of ``sample`` and ``stream``
    that make them sample windows of an episode table (the contract's "Episode tables").

    A call given any of them samples windows and answers a
    :class:`~rlreplay.clients.windows.WindowBatch`; a call given none samples items. The
    server's defaults apply to those left out.

    Attributes:
        length: ``T``, the steps trained on per window (1).
        burn_in: Steps before them that only warm up a recurrent state (0); a window holds
            ``W = burn_in + length`` steps.
        start_every: Windows start only at steps that are a multiple of this (1).
        pad: Let windows run past an episode's last stored step, zeros with ``mask`` false
            (False: only windows wholly within stored steps).
        fields: The step fields returned (all when None).
        n_step: Add n-step ``returns``, ``discount`` and ``next`` with this ``n`` (None:
            none).
        gamma: The discount of the n-step returns (0.99).
        reward_field: The step field the returns sum ("reward").
        next_fields: The fields whose value ``n'`` steps on comes back in ``next``.
    """

    length: int
    burn_in: int
    start_every: int
    pad: bool
    fields: Sequence[str] | None
    n_step: int | None
    gamma: float
    reward_field: str
    next_fields: Sequence[str] | None


class ReplayCalls(Protocol):
    """The calls that the one-server and the sharded async clients share.

    Each is documented on :class:`~rlreplay.clients.client.ReplayClient`.
    """

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
    ) -> dict[str, Any]: ...

    async def list_tables(self) -> list[dict[str, Any]]: ...

    async def describe_table(self, name: str) -> dict[str, Any]: ...

    async def drop_table(self, name: str) -> None: ...

    async def push(
        self,
        table: str,
        items: Sequence[Mapping[str, Any]],
        *,
        wait: bool = False,
        reservation: str | None = None,
    ) -> int: ...

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
    ) -> int: ...

    def writer(self, table: str, *, max_in_flight: int = 8, batch_items: int = 64) -> Writer: ...

    async def get(self, table: str, key: str) -> Item | None: ...

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
    ) -> list[Item | None] | ColumnBatch: ...

    async def update_priorities(
        self, table: str, priorities: Mapping[str, float]
    ) -> dict[str, int]: ...

    async def delete(self, table: str, keys: Iterable[str]) -> int: ...

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
    ) -> list[Item] | ColumnBatch | WindowBatch: ...

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
    ) -> AsyncIterator[list[Item] | ColumnBatch | WindowBatch]: ...

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
    ) -> int: ...

    async def get_episode(
        self, table: str, episode: str, start: int | None = None, stop: int | None = None
    ) -> Episode | None: ...

    async def delete_episode(self, table: str, episode: str) -> None: ...

    def episode_writer(self, table: str, *, max_in_flight: int = 8) -> EpisodeWriter: ...

    async def update_window_priorities(
        self,
        table: str,
        windows: Iterable[WindowStart],
        *,
        eta: float | None = None,
    ) -> dict[str, int]: ...

    async def patch(
        self,
        table: str,
        items: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
        *,
        wait: bool = False,
    ) -> dict[str, int]: ...

    async def claim(
        self, table: str, *, partial: bool = False, **options: Unpack[ClaimOptions]
    ) -> LeaseBase: ...

    def consume(
        self, table: str, *, prefetch: int = 1, **options: Unpack[ClaimOptions]
    ) -> AsyncGenerator[LeaseBase, None]: ...

    async def set_version(
        self, table: str, version: int, *, force: bool = False
    ) -> dict[str, int]: ...

    async def tasks(self, table: str) -> dict[str, Any]: ...

    async def reserve(
        self,
        table: str,
        count: int,
        *,
        version: int,
        wait_ms: int = 10_000,
        ttl_s: float = 600.0,
    ) -> Reservation: ...

    async def return_reservation(self, table: str, reservation: str) -> int: ...

    async def health(self) -> bool: ...

    async def aclose(self) -> None: ...
