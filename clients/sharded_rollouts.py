"""Rollout-table calls of the sharded client: patches, versions, and claims across servers.

A patch goes to the servers owning its keys; a version is set on every server; a claim asks
every server for items and keeps at most ``batch_size`` of them, whole groups only, under a
:class:`ShardedLease` that acknowledges or releases each server's part. Leases, the oldest-
first order and staleness stay per server: a sharded claim hands out each server's oldest
items, not the oldest of the table. Keys of one group must share a hash tag (``{group}/i``,
see :mod:`rlreplay.clients.rendezvous`) so that the group is whole on one server.
``consume`` (:func:`~rlreplay.clients.rollouts.consume_leases`) keeps such claims in flight.

A claim that waits gathers server leases over several rounds, and a server lease taken
early may expire before the claim has its batch: its items are then ready again on that
server, and another caller may hold them. Such a lease is dropped (it lapsed: nothing to
release) and its items are claimed again while the caller's ``wait_ms`` lasts, so a claim
never returns a lease that has expired. A server lease counts as expired from whichever
comes first: its ``expires_at``, or ``lease_s`` after its claim was sent (the client's
clock, which a server whose clock runs ahead cannot stretch).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncGenerator, Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Unpack

import msgspec
import numpy as np
from msgspec import UNSET

from rlreplay.clients.claim_budget import balance_ranks, fit_tokens, item_length
from rlreplay.clients.rollouts import Lease, LeaseBase, claim_request, consume_leases
from rlreplay.clients.surface import ClaimOptions
from rlreplay.wire.errors import DeadlineExceeded, LeaseNotFound, Unavailable, ValidationFailed
from rlreplay.wire.schemas import ClaimRequest

if TYPE_CHECKING:
    from rlreplay.clients.shard_fan_out import ShardFanOut

__all__ = ["ShardedLease", "ShardedRollouts"]

#: How long each server waits, per round, while a short claim waits for more items: rounds
#: start short so that items ready on any server are picked up soon, and grow to bound the
#: number of requests a long wait makes.
_WAIT_SLICE_MS: Final = (25, 500)


class ShardedLease(LeaseBase):
    """The items of a claim across servers: the server leases that handed the kept items.

    It has :class:`~rlreplay.clients.rollouts.Lease`'s interface; ``ack`` and ``release``
    send each server lease its part of the keys, concurrently.

    Attributes:
        parts: ``(server URL, lease)`` pairs, one per server lease (a claim that waited may
            hold several of one server).
        id: The servers' lease ids joined by commas ("" when the claim handed out nothing).
        expires_at: The earliest of the servers' expiries.
        items: Every kept item (``Lease.items``' form), server by server.
    """

    def __init__(
        self, fan_out: ShardFanOut, table: str, parts: Sequence[tuple[int, Lease]]
    ) -> None:
        self._fan_out = fan_out
        self.table = table
        self._parts = sorted(((s, p) for s, p in parts if p.items), key=lambda sp: sp[0])
        self.parts = [(fan_out.urls[s], lease) for s, lease in self._parts]
        self.id = ",".join(lease.id for _, lease in self._parts)
        self.expires_at = min((p.expires_at for _, p in self._parts), default=0.0)
        self.items: list[dict[str, Any]] = [i for _, p in self._parts for i in p.items]
        #: With ``world_size``: indices into ``items``, one list per rank, split by the
        #: client over the merged items (groups whole, longest first).
        self.ranks: list[list[int]] | None = None
        self.done = not self.items

    async def _each_part(self, action: str, keys: Sequence[str] | None) -> int:
        """``action`` on each server lease with its part of ``keys`` (its kept items when
        None: named, since a server lease also holds the surplus it released at once)."""
        calls = []
        for s, lease in self._parts:
            mine = lease.keys
            if keys is not None:
                held = set(mine)
                mine = [key for key in keys if key in held]
            if mine:
                calls.append(self._fan_out.on(s, getattr(lease, action)(mine)))
        counts: list[int] = []
        for outcome in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome
            counts.append(int(outcome))
        if keys is None:
            self.done = True
        return sum(counts)

    async def ack(self, keys: Sequence[str] | None = None) -> int:
        """The items (all when ``keys`` is None) count as consumed by the task, durably.

        Returns:
            How many are acknowledged, over every server.

        Raises:
            LeaseNotFound: A server's lease expired (every part was still sent).
        """
        return await self._each_part("ack", keys)

    async def release(self, keys: Sequence[str] | None = None) -> int:
        """The items (all when ``keys`` is None) are ready for the task again."""
        return await self._each_part("release", keys)


def _fitting(items: list[dict[str, Any]], room: int, by_group: bool) -> list[int]:
    """The positions of ``items`` (one server's answer) kept in ``room``: the first ones, or
    with ``by_group`` whole groups in the order they first appear."""
    if not by_group:
        return list(range(min(room, len(items))))
    groups: dict[Any, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(item.get("group"), []).append(i)
    keep: list[int] = []
    for places in groups.values():
        if len(keep) + len(places) <= room:
            keep.extend(places)
    return sorted(keep)


def _measuring(request: ClaimRequest, field: str | None) -> tuple[ClaimRequest, bool]:
    """The request each server gets: no ``world_size`` (the client splits the merged
    items), and ``field`` among the fields returned when the caller's ``select`` (or
    ``fields``) leaves it out, so that the client can measure it; and whether it was added
    (it is taken out of the answer again)."""
    returned = request.select if request.select is not UNSET else request.fields
    add = field is not None and returned is not UNSET and field not in returned
    select = [*returned, field] if add and returned is not UNSET and field else request.select
    return msgspec.structs.replace(request, world_size=UNSET, select=select), add


def _expired(lease: Lease, lapse: Mapping[str, float]) -> bool:
    """Whether a server lease has expired: its ``expires_at`` passed, or the time it
    lapses by on this client's clock (``lapse``, by lease id)."""
    return time.time() >= lease.expires_at or time.monotonic() >= lapse.get(lease.id, math.inf)


def _drop_expired(kept: list[tuple[int, Lease]], lapse: Mapping[str, float]) -> int:
    """Take the expired server leases out of ``kept``; returns how many items they held."""
    dropped = 0
    for part in [part for part in kept if _expired(part[1], lapse)]:
        kept.remove(part)
        dropped += len(part[1].items)
    return dropped


class ShardedRollouts:
    """Rollout-table calls across servers: the part of
    :class:`~rlreplay.clients.sharded.ShardedReplayClient` that answers its ``patch``,
    ``set_version``, ``tasks``, ``claim`` and ``consume``.

    Args:
        fan_out: The servers, and how calls are sent to them.
        allow_partial: A claim is served by the servers that answer when some cannot be
            reached, instead of raising ``Unavailable``.
        rng: Picks the server a claim keeps items from first.
    """

    def __init__(
        self, fan_out: ShardFanOut, *, allow_partial: bool, rng: np.random.Generator
    ) -> None:
        self._fan_out = fan_out
        self._allow_partial = allow_partial
        self._rng = rng

    async def patch(
        self,
        table: str,
        items: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
        *,
        wait: bool = False,
    ) -> dict[str, int]:
        """Set fields of existing items' values on the servers owning them
        (``ReplayClient.patch``); the counts are summed over the servers."""
        pairs = (
            list(items.items())
            if isinstance(items, Mapping)
            else [(item["key"], item["fields"]) for item in items]
        )
        if not pairs:
            return {"accepted": 0, "missing": 0}
        calls = {
            s: self._fan_out.shards[s].patch(
                table, {pairs[i][0]: pairs[i][1] for i in places}, wait=wait
            )
            for s, places in self._fan_out.split([key for key, _ in pairs]).items()
        }
        total: dict[str, int] = {}
        for answer in (await self._fan_out.each(calls)).values():
            for name, count in answer.items():
                total[name] = total.get(name, 0) + count
        return total

    async def set_version(self, table: str, version: int, *, force: bool = False) -> dict[str, int]:
        """Set the policy version on every server (``ReplayClient.set_version``, ``force``
        included).

        Returns:
            ``{"version", "dropped_stale"}``: the version, and the stale items dropped
            over every server.

        Raises:
            VersionConflict: A server is at a higher version (the others were still set).
        """
        answers = await self._fan_out.every(lambda c: c.set_version(table, version, force=force))
        return {
            "version": max(a["version"] for a in answers),
            "dropped_stale": sum(a["dropped_stale"] for a in answers),
        }

    async def tasks(self, table: str) -> dict[str, Any]:
        """``ReplayClient.tasks`` over every server: each task's counts, ``dropped_stale``
        and ``reserved`` summed, ``version`` the highest."""
        merged: dict[str, dict[str, int]] = {}
        answers = await self._fan_out.every(lambda c: c.tasks(table))
        for answer in answers:
            for name, counts in answer.get("tasks", {}).items():
                into = merged.setdefault(name, {})
                for field, count in counts.items():
                    into[field] = into.get(field, 0) + int(count)
        return {
            "tasks": merged,
            "version": max(int(a.get("version", 0)) for a in answers),
            "dropped_stale": sum(int(a.get("dropped_stale", 0)) for a in answers),
            "reserved": sum(int(a.get("reserved", 0)) for a in answers),
        }

    async def claim(
        self, table: str, *, partial: bool = False, **options: Unpack[ClaimOptions]
    ) -> ShardedLease:
        """Claim up to ``batch_size`` items ready for ``task`` across the servers.

        Every server is asked at once for its share of the batch (``partial``, not waiting),
        and when that falls short, at once again for all that is missing; what comes back
        beyond ``batch_size`` is released at once, keeping whole groups. While short and
        ``wait_ms`` is not over, every server is asked again for what is still missing, each
        waiting a short slice (growing from 25 ms to 500 ms) so that items ready on any
        server are taken soon after they are. A server lease that expires meanwhile is
        dropped and its items claimed again, so the lease returned has not expired (with
        ``partial``, it may then hold fewer). Each server's items are its oldest; across
        servers the order is not global.

        Raises:
            ValidationFailed: ``batch_size`` is not a multiple of ``group_size``.
            DeadlineExceeded: ``batch_size`` items were not ready within ``wait_ms`` (and
                ``partial`` is False); nothing stays leased.
            Unavailable: A server cannot be reached (unless the client's ``allow_partial``
                is set: the others then serve the claim).
        """
        request = claim_request(options, partial=partial)
        task, batch_size, wait_ms = request.task, request.batch_size, request.wait_ms
        budget = None if request.max_tokens is UNSET else request.max_tokens
        field = None if request.length_field is UNSET else request.length_field
        world = None if request.world_size is UNSET else request.world_size
        request, added = _measuring(request, field)
        tokens, full = 0, False  # the kept items' tokens; a group was left out for them
        group_size = None if request.group_size is UNSET else request.group_size
        if group_size is not None and group_size > 0 and batch_size % group_size:
            raise ValidationFailed(
                f"batch_size ({batch_size}) must be a multiple of group_size ({group_size})"
            )
        live = list(range(len(self._fan_out.shards)))
        kept: list[tuple[int, Lease]] = []
        lapse: dict[str, float] = {}  # server lease id → time.monotonic() it lapses by
        held = 0
        deadline = time.monotonic() + max(wait_ms, 0) / 1000
        slice_ms, max_slice_ms = _WAIT_SLICE_MS
        wait = 0
        spread = len(live) > 1  # the first round asks each server for its share only
        answers: list[tuple[int, Lease]] = []  # answered but not yet kept or released
        try:
            while True:
                ask = batch_size - held
                if spread and ask > 0:  # whole groups each, rounded up
                    unit = group_size or 1
                    ask = math.ceil(ask / unit / len(live)) * unit
                sent = time.monotonic()
                part = msgspec.structs.replace(request, batch_size=ask, wait_ms=wait, partial=True)
                if budget is not None:  # the servers' budgets: shares of what is left
                    left = max(1, budget - tokens)
                    part.max_tokens = math.ceil(left / len(live)) if spread else left
                calls = {s: self._fan_out.shards[s]._claim(table, part) for s in live}
                answers = list((await self._answers(calls, live)).items())
                for _, lease in answers:
                    lapse[lease.id] = sent + request.lease_s
                # kept from a random first server on: none is drained before the others
                start = int(self._rng.integers(len(answers))) if answers else 0
                answers = answers[start:] + answers[:start]
                while answers:
                    s, lease = answers[0]
                    if not _expired(lease, lapse):
                        room, by_group = batch_size - held, group_size is not None
                        if budget is None or field is None:
                            keep = _fitting(lease.items, room, by_group)
                        else:
                            keep, used, cut = fit_tokens(
                                lease.items, field, room, budget - tokens, by_group, not held
                            )
                            tokens, full = tokens + used, full or cut
                        held += await self._keep(s, lease, keep, kept)
                    answers.pop(0)
                dropped = _drop_expired(kept, lapse)  # their items are the server's again
                if dropped:
                    held -= dropped
                    tokens = sum(item_length(it, field) for _, p in kept for it in p.items)
                    full = False
                if held >= batch_size or full:
                    break
                if spread:  # short: ask every server at once for all that is missing
                    spread = False
                    continue
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    break
                wait = min(slice_ms, left_ms)
                slice_ms = min(slice_ms * 2, max_slice_ms)
            if held < batch_size and not full and not partial:
                raise DeadlineExceeded(
                    f"{held} of {batch_size} items were ready for task {task!r} over "
                    f"{len(live)} shards within {wait_ms} ms"
                )
        except BaseException:
            await asyncio.gather(
                *(lease.release() for _, lease in [*kept, *answers]),
                return_exceptions=True,
            )
            raise
        merged = ShardedLease(self._fan_out, table, kept)
        if world is not None:
            lengths = [item_length(it, field) for it in merged.items] if field else []
            merged.ranks = balance_ranks(
                lengths or [1] * len(merged.items), [it.get("group") for it in merged.items], world
            )
        for item in merged.items if added and field is not None else []:
            item_fields = item.get("lengths") if "lengths" in item else item.get("value")
            if isinstance(item_fields, dict):
                item_fields.pop(field, None)
        return merged

    def consume(
        self, table: str, *, prefetch: int = 1, **options: Unpack[ClaimOptions]
    ) -> AsyncGenerator[LeaseBase, None]:
        """Sharded leases one after another, ``prefetch`` claims in flight
        (``ReplayClient.consume``)."""
        claim_request(options, partial=False)  # a bad option raises here, not at first use

        async def claim() -> LeaseBase:
            return await self.claim(table, **options)

        return consume_leases(claim, prefetch)

    async def _answers(
        self, calls: Mapping[int, Awaitable[Lease]], live: list[int]
    ) -> dict[int, Lease]:
        """Each server's lease; with the client's ``allow_partial``, servers that cannot be
        reached leave ``live`` instead of failing the claim. Leases of servers that answered
        are released when another failed."""
        outcomes = await self._fan_out.outcomes(calls)
        answers = {s: o for s, o in outcomes.items() if isinstance(o, Lease)}
        error = None
        for s, outcome in outcomes.items():
            if isinstance(outcome, Unavailable) and self._allow_partial:
                live.remove(s)
            elif isinstance(outcome, BaseException):
                error = error or outcome
        if error is None and not live:
            error = Unavailable(f"none of the {len(self._fan_out.urls)} shards is reachable")
        if error is not None:
            await asyncio.gather(
                *(lease.release() for lease in answers.values()), return_exceptions=True
            )
            raise error
        return answers

    async def _release_surplus(self, s: int, lease: Lease, keys: list[str] | None) -> None:
        """Release ``keys`` of a lease (all when None); one that expired meanwhile released
        them itself."""
        try:
            await self._fan_out.on(s, lease.release(keys))
        except LeaseNotFound:
            pass

    async def _keep(
        self, s: int, lease: Lease, keep: list[int], kept: list[tuple[int, Lease]]
    ) -> int:
        """Keep the items of ``lease`` at the positions ``keep``, release the rest at once,
        and return how many were kept."""
        if len(keep) < len(lease.items):
            if not keep:
                await self._release_surplus(s, lease, None)
                return 0
            chosen = set(keep)
            surplus = [it["key"] for i, it in enumerate(lease.items) if i not in chosen]
            await self._release_surplus(s, lease, surplus)
            lease.items = [lease.items[i] for i in keep]
        if keep:
            kept.append((s, lease))
        return len(keep)
