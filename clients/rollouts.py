"""The client's calls of rollout tables: patches, claims under leases, versions.

A claim answers a :class:`Lease`: its ``items``, and ``ack()`` / ``release()``. Used as an
async context manager, a lease is acknowledged when the block ends normally and released
when it raises, so a task that fails hands its items back at once rather than when the
lease expires::

    lease = await rb.claim("rollouts", task="trainer", fields=["reward"], batch_size=64)
    async with lease:
        train_on(lease.items)

``consume`` (:func:`consume_leases`) keeps claims in flight and yields leases one after
another, acknowledging each when the next one is asked for. The options of both are one
:class:`~rlreplay.clients.surface.ClaimOptions`.
"""

from __future__ import annotations

import asyncio
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self, Unpack

import msgspec
from msgspec import UNSET

from rlreplay.clients.requester import Requester, answer_map, table_path
from rlreplay.clients.surface import ClaimOptions
from rlreplay.wire.codec import packb
from rlreplay.wire.errors import DeadlineExceeded
from rlreplay.wire.rollout_scale import DEFAULT_RESERVATION_TTL_S, ReservationRequest
from rlreplay.wire.schemas import (
    ClaimRequest,
    LeaseKeysRequest,
    PatchItemIn,
    PatchRequest,
    VersionRequest,
)

__all__ = [
    "Lease",
    "LeaseBase",
    "Reservation",
    "Rollouts",
    "claim_request",
    "consume_leases",
    "new_request_id",
]

_CLAIM_TIMEOUT_MARGIN_S: Final = 5.0
_CLAIM_OPTIONS: Final = ClaimOptions.__required_keys__ | ClaimOptions.__optional_keys__


@dataclass(frozen=True, slots=True)
class Reservation:
    """Slots granted to a generator: push with ``reservation=id`` to fill them. On a
    sharded client ``id`` names each server's reservation (``"<server>:<id>,..."``)."""

    id: str
    granted: int
    expires_at: float


def new_request_id() -> str:
    """A fresh idempotency key for one write (its retries reuse it)."""
    return uuid.uuid4().hex


class LeaseBase(ABC):
    """What every lease shares: its ``items`` and ``keys``, and ``async with`` that
    acknowledges when the block ends normally and releases when it raises."""

    id: str
    table: str
    expires_at: float
    items: list[dict[str, Any]]
    done: bool

    def __len__(self) -> int:
        return len(self.items)

    @property
    def keys(self) -> list[str]:
        """The keys handed out."""
        return [item["key"] for item in self.items]

    @abstractmethod
    async def ack(self, keys: Sequence[str] | None = None) -> int:
        """Acknowledge ``keys`` (all by default); returns how many were acknowledged."""

    @abstractmethod
    async def release(self, keys: Sequence[str] | None = None) -> int:
        """Release ``keys`` (all by default); returns how many were released."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.done:
            return
        if exc_type is None:
            await self.ack()
        else:
            await self.release()


class Lease(LeaseBase):
    """Items a claim handed to a task, until acknowledged, released or expired.

    Attributes:
        id: The lease's id ("" when the claim handed out nothing).
        expires_at: Unix time when the server releases what is not acknowledged.
        items: ``{"key", "value", "priority", "group", "version"}`` each; values hold the
            fields asked for.
    """

    def __init__(self, rollouts: Rollouts, table: str, answer: Mapping[str, Any]) -> None:
        self._rollouts = rollouts
        self.table = table
        self.id: str = str(answer.get("lease", ""))
        self.expires_at: float = float(answer.get("expires_at", 0.0))
        self.items: list[dict[str, Any]] = list(answer.get("items", []))
        #: With ``world_size``: indices into ``items``, one list per rank.
        self.ranks: list[list[int]] | None = answer.get("ranks")
        self.done = not self.items

    async def ack(self, keys: Sequence[str] | None = None) -> int:
        """The items (all when ``keys`` is None) count as consumed by the task, durably.

        Returns:
            How many are acknowledged (a repeat counts them again: retrying is safe).

        Raises:
            LeaseNotFound: The lease expired (its items were handed out again).
        """
        if not self.id:
            return 0
        answer = await self._rollouts.lease_call(self.table, self.id, ":ack", keys)
        if keys is None:
            self.done = True
        return int(answer.get("acked", 0))

    async def release(self, keys: Sequence[str] | None = None) -> int:
        """The items (all when ``keys`` is None) are ready for the task again."""
        if not self.id:
            return 0
        answer = await self._rollouts.lease_call(self.table, self.id, ":release", keys)
        if keys is None:
            self.done = True
        return int(answer.get("released", 0))


def claim_request(options: ClaimOptions, *, partial: bool) -> ClaimRequest:
    """The wire request of a claim: the options given, the rest left at the request's
    defaults.

    Raises:
        TypeError: An option is unknown, or ``task`` or ``batch_size`` is missing (as for a
            call with explicit keyword arguments).
    """
    unknown = sorted(options.keys() - _CLAIM_OPTIONS)
    if unknown:
        raise TypeError(f"claim() got unexpected keyword argument(s): {', '.join(unknown)}")
    missing = [name for name in ("task", "batch_size") if name not in options]
    if missing:
        raise TypeError(f"claim() missing keyword argument(s): {', '.join(missing)}")
    request = ClaimRequest(options["task"], options["batch_size"], partial=partial)
    if (fields := options.get("fields")) is not None:
        request.fields = list(fields)
    if (group_size := options.get("group_size")) is not None:
        request.group_size = group_size
    if "lease_s" in options:
        request.lease_s = options["lease_s"]
    if "wait_ms" in options:
        request.wait_ms = options["wait_ms"]
    if (min_version := options.get("min_version")) is not None:
        request.min_version = min_version
    if (where := options.get("where")) is not None:
        request.where = dict(where)
    if (select := options.get("select")) is not None:
        request.select = list(select)
    if "values" in options:
        request.values = options["values"]
    for name in ("max_tokens", "length_field", "world_size"):
        if (given := options.get(name)) is not None:
            setattr(request, name, given)
    return request


async def consume_leases(
    claim: Callable[[], Awaitable[LeaseBase]], prefetch: int
) -> AsyncGenerator[LeaseBase, None]:
    """Leases one after another from ``claim``, ``prefetch`` claims in flight: every
    client's ``consume``.

    Leases come in the order their claims are answered: a claim that waits for items
    never holds back one answered after it (which may hold the last ready items). The
    lease in hand is acknowledged as soon as the next one is asked for (the ack runs
    while the next claim waits and the caller works on the next lease; an ack that fails
    ends the iteration with its error, at the following step); when the loop ends
    (``break``, an exception, closing the generator) the lease in hand is released,
    and the claims in flight are cancelled (a lease the server had issued for one
    then comes back when it expires). A claim that finds nothing ready within
    ``wait_ms`` is made again: the iteration ends only when the caller stops it.
    """
    if prefetch < 1:
        raise ValueError(f"prefetch ({prefetch}) must be >= 1")
    pending: list[asyncio.Task[LeaseBase]] = []

    async def one() -> LeaseBase:
        while True:
            try:
                return await claim()
            except DeadlineExceeded:
                continue

    current: LeaseBase | None = None
    acking: asyncio.Task[int] | None = None  # the previous lease's ack, in flight
    try:
        while True:
            if acking is not None:
                await acking  # its error, if any, ends the iteration
                acking = None
            if current is not None:
                # the caller is done with it: acknowledged now, not once the next claim
                # is answered, which may take longer than the lease lasts
                acking = asyncio.create_task(current.ack())
                current = None
            if not pending:
                pending.append(asyncio.create_task(one()))
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            answered = next(claim_task for claim_task in pending if claim_task.done())
            pending.remove(answered)
            current = answered.result()
            while len(pending) < prefetch:  # in flight while the caller works
                pending.append(asyncio.create_task(one()))
            yield current
    finally:
        for claim_task in pending:
            claim_task.cancel()
        leftovers = await asyncio.gather(*pending, return_exceptions=True)
        if acking is not None:
            await asyncio.gather(acking, return_exceptions=True)
        for leftover in [current, *leftovers]:
            if isinstance(leftover, LeaseBase) and not leftover.done:
                await leftover.release()


class Rollouts:
    """The rollout-table calls of :class:`~rlreplay.clients.client.ReplayClient`: patches,
    claims and their leases, policy versions, reservations.

    Args:
        requester: Sends the calls to the server.
    """

    def __init__(self, requester: Requester) -> None:
        self._requester = requester

    async def patch(
        self,
        table: str,
        items: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
        *,
        wait: bool = False,
    ) -> dict[str, int]:
        """Set fields of existing items' values, keeping the others.

        Args:
            table: The table.
            items: ``{key: {field: value}}``, or ``[{"key", "fields"?, "tags"?}]`` (tags
                are set in the item's tags, keeping the others).
            wait: Answer once the writer applied them.

        Returns:
            ``{"accepted" (or "committed"): n, "missing": m}``: keys not in the table are
            skipped and counted.
        """
        entries: list[Mapping[str, Any]] = (
            [{"key": key, "fields": fields} for key, fields in items.items()]
            if isinstance(items, Mapping)
            else list(items)
        )
        if not entries:
            return {"accepted": 0, "missing": 0}
        body = PatchRequest(
            [
                PatchItemIn(
                    item["key"],
                    msgspec.Raw(packb(dict(item["fields"]))) if "fields" in item else UNSET,
                    dict(item["tags"]) if "tags" in item else UNSET,
                )
                for item in entries
            ],
            wait,
            new_request_id(),
        )
        answer = await self._requester.call(
            "POST", table_path(table, "/items:patch"), body=body, idempotent=True
        )
        return {k: int(v) for k, v in answer_map(answer).items()}

    async def claim(
        self, table: str, *, partial: bool = False, **options: Unpack[ClaimOptions]
    ) -> Lease:
        """Claim the oldest items ready for a task under a lease (see :class:`Lease`).

        Args:
            table: The rollout table.
            partial: Past ``wait_ms``, take what is ready (maybe nothing) instead of
                raising ``DeadlineExceeded``.
            **options: ``task`` and ``batch_size``, and optionally ``fields``,
                ``group_size``, ``lease_s``, ``wait_ms``, ``min_version``
                (:class:`~rlreplay.clients.surface.ClaimOptions` says what each means).

        Raises:
            DeadlineExceeded: ``batch_size`` items were not ready within ``wait_ms`` (and
                ``partial`` is False).
        """
        return await self.claim_body(table, claim_request(options, partial=partial))

    async def claim_body(self, table: str, body: ClaimRequest) -> Lease:
        """One claim of this server (the sharded client sends its own requests here)."""
        answer = await self._requester.call(
            "POST",
            table_path(table, "/claim"),
            body=body,
            idempotent=False,
            read_timeout_s=max(
                self._requester.timeout_s, body.wait_ms / 1000 + _CLAIM_TIMEOUT_MARGIN_S
            ),
        )
        return Lease(self, table, answer_map(answer))

    def consume(
        self, table: str, *, prefetch: int = 1, **options: Unpack[ClaimOptions]
    ) -> AsyncGenerator[LeaseBase, None]:
        """Leases of ``batch_size`` items one after another, ``prefetch`` claims in flight
        (:func:`consume_leases` says when each is acknowledged or released).

        Args:
            table: The rollout table.
            prefetch: Claims kept in flight (at least 1).
            **options: As :meth:`claim`'s.
        """
        claim_request(options, partial=False)  # a bad option raises here, not at first use

        async def claim() -> LeaseBase:
            return await self.claim(table, **options)

        return consume_leases(claim, prefetch)

    async def lease_call(
        self, table: str, lease: str, action: str, keys: Sequence[str] | None
    ) -> dict[str, Any]:
        """Acknowledge (``action`` ``":ack"``) or release (``":release"``) a lease's keys."""
        path = table_path(table, "/leases/") + lease + action
        body = LeaseKeysRequest(UNSET if keys is None else list(keys))
        return answer_map(await self._requester.call("POST", path, body=body, idempotent=True))

    async def set_version(self, table: str, version: int, *, force: bool = False) -> dict[str, int]:
        """Move the table's policy version forward (``VersionConflict`` if it is lower).

        Args:
            table: The rollout table.
            version: The trainer's current policy version.
            force: Set a version more than 1,000,000 past the current one, which the server
                otherwise refuses (``ValidationFailed``) as a likely mistake: with
                ``max_staleness`` it would drop every rollout for good.

        Returns:
            ``{"version", "dropped_stale"}``.
        """
        answer = await self._requester.call(
            "PUT",
            table_path(table, "/version"),
            body=VersionRequest(version, force=True if force else UNSET),
            idempotent=True,
        )
        return {k: int(v) for k, v in answer_map(answer).items()}

    async def reserve(
        self,
        table: str,
        count: int,
        *,
        version: int,
        wait_ms: int = 10_000,
        ttl_s: float = DEFAULT_RESERVATION_TTL_S,
    ) -> Reservation:
        """Reserve slots before generating ``count`` rollouts at policy ``version``.

        Waits up to ``wait_ms`` for at least one slot (the table's ``admission.max_ahead``);
        push with ``reservation=`` the answer's ``id`` to fill them; unfilled slots return
        after ``ttl_s`` or with :meth:`return_reservation`.

        Raises:
            DeadlineExceeded: No slot came free within ``wait_ms``.
            VersionConflict: ``version`` is outside the table's staleness window.
        """
        answer = await self._requester.call(
            "POST",
            table_path(table, "/reservations"),
            body=ReservationRequest(count, version, wait_ms, ttl_s),
            idempotent=False,
            read_timeout_s=max(self._requester.timeout_s, wait_ms / 1000 + _CLAIM_TIMEOUT_MARGIN_S),
        )
        got = answer_map(answer)
        return Reservation(str(got["reservation"]), int(got["granted"]), float(got["expires_at"]))

    async def return_reservation(self, table: str, reservation: str) -> int:
        """Return a reservation's unfilled slots; how many (``LeaseNotFound`` once it is
        not live: filled, returned or expired)."""
        path = table_path(table, "/reservations/") + reservation
        answer = answer_map(await self._requester.call("DELETE", path, idempotent=True))
        return int(answer.get("returned", 0))

    async def tasks(self, table: str) -> dict[str, Any]:
        """``{"tasks": {name: {"ready", "leased", "acked", "expired"}}, "version",
        "dropped_stale", "reserved"}``."""
        return answer_map(
            await self._requester.call("GET", table_path(table, "/tasks"), idempotent=True)
        )
