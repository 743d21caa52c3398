"""The client's calls of rollout tables: patches, claims under leases, versions.

A claim answers a :class:`Lease`: its ``items``, and ``ack()`` / ``release()``. Used as an
async context manager, a lease is acknowledged when the block ends normally and released
when it raises, so a task that fails hands its items back at once rather than when the
lease expires::

    lease = await rb.claim("rollouts", task="trainer", fields=["reward"], batch_size=64)
    async with lease:
        train_on(lease.items)

:meth:`ClaimLoop.consume` keeps claims in flight and yields leases one after another,
acknowledging each when the next one is asked for.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import msgspec
from msgspec import UNSET

from rlreplay.clients.requester import Requester
from rlreplay.wire.codec import packb
from rlreplay.wire.errors import DeadlineExceeded
from rlreplay.wire.schemas import (
    DEFAULT_TIMEOUT_MS,
    ClaimRequest,
    LeaseKeysRequest,
    PatchItemIn,
    PatchRequest,
    VersionRequest,
)

__all__ = ["ClaimLoop", "Lease", "LeaseBase", "RolloutCalls", "new_request_id"]

_CLAIM_TIMEOUT_MARGIN_S = 5.0


def new_request_id() -> str:
    """A fresh idempotency key for one write (its retries reuse it)."""
    return uuid.uuid4().hex


class LeaseBase:
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

    async def ack(self, keys: Sequence[str] | None = None) -> int:
        raise NotImplementedError

    async def release(self, keys: Sequence[str] | None = None) -> int:
        raise NotImplementedError

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

    def __init__(self, client: RolloutCalls, table: str, answer: Mapping[str, Any]) -> None:
        self._client = client
        self.table = table
        self.id: str = str(answer.get("lease", ""))
        self.expires_at: float = float(answer.get("expires_at", 0.0))
        self.items: list[dict[str, Any]] = list(answer.get("items", []))
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
        answer = await self._client._lease_call(self.table, self.id, ":ack", keys)
        if keys is None:
            self.done = True
        return int(answer.get("acked", 0))

    async def release(self, keys: Sequence[str] | None = None) -> int:
        """The items (all when ``keys`` is None) are ready for the task again."""
        if not self.id:
            return 0
        answer = await self._client._lease_call(self.table, self.id, ":release", keys)
        if keys is None:
            self.done = True
        return int(answer.get("released", 0))


class ClaimLoop:
    """``consume``, over whichever ``claim`` the client has (one server's, or the sharded
    client's across servers)."""

    async def claim(
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
    ) -> LeaseBase:
        """The client's own claim: one server's, or the sharded client's."""
        raise NotImplementedError

    async def consume(
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
    ) -> AsyncGenerator[LeaseBase, None]:
        """Leases of ``batch_size`` items one after another, ``prefetch`` claims in flight.

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
                    return await self.claim(
                        table,
                        task=task,
                        batch_size=batch_size,
                        fields=fields,
                        group_size=group_size,
                        lease_s=lease_s,
                        wait_ms=wait_ms,
                        min_version=min_version,
                    )
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


class RolloutCalls(Requester, ClaimLoop):
    """Rollout-table calls of :class:`~rlreplay.clients.client.ReplayClient`."""

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
            items: ``{key: {field: value}}``, or ``[{"key", "fields"}]``.
            wait: Answer once the writer applied them.

        Returns:
            ``{"accepted" (or "committed"): n, "missing": m}``: keys not in the table are
            skipped and counted.
        """
        pairs = (
            list(items.items())
            if isinstance(items, Mapping)
            else [(item["key"], item["fields"]) for item in items]
        )
        if not pairs:
            return {"accepted": 0, "missing": 0}
        body = PatchRequest(
            [PatchItemIn(key, msgspec.Raw(packb(dict(fields)))) for key, fields in pairs],
            wait,
            new_request_id(),
        )
        answer = await self._call(
            "POST", self._table(table, "/items:patch"), body=body, idempotent=True
        )
        return {k: int(v) for k, v in self._as_dict(answer).items()}

    async def claim(
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
    ) -> Lease:
        """Claim the oldest items ready for ``task`` under a lease (see :class:`Lease`).

        Raises:
            DeadlineExceeded: ``batch_size`` items were not ready within ``wait_ms`` (and
                ``partial`` is False).
        """
        body = ClaimRequest(
            task,
            batch_size,
            UNSET if fields is None else list(fields),
            UNSET if group_size is None else group_size,
            lease_s,
            wait_ms,
            partial,
            UNSET if min_version is None else min_version,
        )
        answer = await self._call(
            "POST",
            self._table(table, "/claim"),
            body=body,
            idempotent=False,
            read_timeout_s=max(self._timeout_s, wait_ms / 1000 + _CLAIM_TIMEOUT_MARGIN_S),
        )
        return Lease(self, table, self._as_dict(answer))

    async def _lease_call(
        self, table: str, lease: str, action: str, keys: Sequence[str] | None
    ) -> dict[str, Any]:
        path = self._table(table, "/leases/") + lease + action
        body = LeaseKeysRequest(UNSET if keys is None else list(keys))
        return self._as_dict(await self._call("POST", path, body=body, idempotent=True))

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
        answer = await self._call(
            "PUT",
            self._table(table, "/version"),
            body=VersionRequest(version, force=True if force else UNSET),
            idempotent=True,
        )
        return {k: int(v) for k, v in self._as_dict(answer).items()}

    async def tasks(self, table: str) -> dict[str, Any]:
        """``{"tasks": {name: {"ready", "leased", "acked", "expired"}}, "version",
        "dropped_stale"}``."""
        return self._as_dict(await self._call("GET", self._table(table, "/tasks"), idempotent=True))
