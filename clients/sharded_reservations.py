"""Reservations on a table spread over servers (the sharded client's ``reserve``).

A reservation is a server's: each server paces the part of the table it holds. The sharded
client spreads ``count`` over the servers (as evenly as it divides, the first servers
taking the remainder), asks them all at once, and answers one :class:`Reservation` whose
``id`` names each server's reservation as ``"<server>:<id>"``, joined by commas; a push
naming it gives each server its own id for the items it holds. A server with no slot free
within ``wait_ms`` grants none; the call raises ``DeadlineExceeded`` only when no server
granted any, and ``VersionConflict`` when a server refuses the version (the others'
reservations are returned first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.clients.bodies import ColumnsMeta
from rlreplay.clients.rollouts import Reservation
from rlreplay.clients.shard_fan_out import ShardFanOut
from rlreplay.clients.shard_merge import column_rows
from rlreplay.wire.errors import DeadlineExceeded, LeaseNotFound, ValidationFailed

__all__ = [
    "push_columns_spread",
    "push_spread",
    "reserve_sharded",
    "return_sharded",
    "server_reservations",
]


def server_reservations(reservation: str | None) -> dict[int, str]:
    """Each server's reservation id in a sharded reservation's id (none for None)."""
    if not reservation:
        return {}
    out: dict[int, str] = {}
    for part in reservation.split(","):
        shard, _, rid = part.partition(":")
        if shard.isdigit() and rid:
            out[int(shard)] = rid
    return out


async def reserve_sharded(
    fan_out: ShardFanOut, table: str, count: int, version: int, wait_ms: int, ttl_s: float
) -> Reservation:
    """Reserve ``count`` slots spread over the servers (see the module docstring)."""
    n = len(fan_out.shards)
    shares = [count // n + (1 if s < count % n else 0) for s in range(n)]
    asked = {s: share for s, share in enumerate(shares) if share}
    results = await asyncio.gather(
        *(
            fan_out.shards[s].reserve(table, share, version=version, wait_ms=wait_ms, ttl_s=ttl_s)
            for s, share in asked.items()
        ),
        return_exceptions=True,
    )
    granted: dict[int, Reservation] = {}
    failure: BaseException | None = None
    for s, result in zip(asked, results, strict=True):
        if isinstance(result, Reservation):
            granted[s] = result
        elif not isinstance(result, DeadlineExceeded) and failure is None:
            failure = fan_out.named(s, result)
    if failure is not None or not granted:
        for s, got in granted.items():
            await fan_out.shards[s].return_reservation(table, got.id)
        if failure is not None:
            raise failure
        raise DeadlineExceeded(
            f"table {table!r}: no server had a slot free within {wait_ms / 1000:g} s"
        )
    return Reservation(
        ",".join(f"{s}:{got.id}" for s, got in granted.items()),
        sum(got.granted for got in granted.values()),
        min(got.expires_at for got in granted.values()),
    )


async def return_sharded(fan_out: ShardFanOut, table: str, reservation: str) -> int:
    """Return every server's unfilled slots of a sharded reservation; LeaseNotFound when
    none of its parts is live."""
    ids = server_reservations(reservation)
    results = await asyncio.gather(
        *(fan_out.shards[s].return_reservation(table, rid) for s, rid in ids.items()),
        return_exceptions=True,
    )
    returned = 0
    live = False
    for s, result in zip(ids, results, strict=True):
        if isinstance(result, int):
            returned += result
            live = True
        elif not isinstance(result, LeaseNotFound):
            raise fan_out.named(s, result)
    if not live:
        raise LeaseNotFound(f"no live reservation {reservation!r} on table {table!r}")
    return returned


async def push_spread(
    fan_out: ShardFanOut,
    table: str,
    items: Sequence[Mapping[str, Any]],
    wait: bool,
    reservation: str | None,
) -> int:
    """Push each item on its key's server, naming that server's part of ``reservation``.

    A server that fails fails the call; the parts other servers took stay (pushing again is
    safe: a key's item is replaced).
    """
    if not items:
        return 0
    groups = fan_out.split([_key(item, i) for i, item in enumerate(items)])
    ids = server_reservations(reservation)
    calls = {
        s: fan_out.shards[s].push(
            table, [items[i] for i in places.tolist()], wait=wait, reservation=ids.get(s)
        )
        for s, places in groups.items()
    }
    return sum((await fan_out.each(calls)).values())


async def push_columns_spread(
    fan_out: ShardFanOut,
    table: str,
    keys: Sequence[str],
    columns: Mapping[str, Any],
    priorities: Any,
    wait: bool,
    meta: ColumnsMeta,
) -> int:
    """Push columns on the keys' servers: each gets the rows of its keys, its entries of
    the per-key ``tags``, ``groups`` and ``versions``, and its part of the reservation."""
    keys = list(keys)
    if not keys:
        return 0
    prios = None if priorities is None else np.asarray(priorities, dtype=np.float64)
    ids = server_reservations(meta.get("reservation"))
    calls = {}
    for s, places in fan_out.split(keys).items():
        rows = places.tolist()
        calls[s] = fan_out.shards[s].push_columns(
            table,
            [keys[i] for i in rows],
            {name: column_rows(values, places) for name, values in columns.items()},
            priorities=None if prios is None else prios[places],
            wait=wait,
            tags=_rows(meta.get("tags"), rows),
            groups=_rows(meta.get("groups"), rows),
            versions=_rows(meta.get("versions"), rows),
            reservation=ids.get(s),
        )
    return sum((await fan_out.each(calls)).values())


def _rows(given: Sequence[Any] | None, rows: list[int]) -> list[Any] | None:
    """The entries ``rows`` of a per-key list (None when not given)."""
    return None if given is None else [given[i] for i in rows]


def _key(item: Mapping[str, Any], i: int) -> str:
    """An item's key, or the server's 422 when it has none."""
    if "key" not in item:
        raise ValidationFailed(f"missing field(s) in items[{i}]: key")
    key: str = item["key"]
    return key
