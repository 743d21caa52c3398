"""Table calls of :class:`~rlreplay.clients.sharded.ShardedReplayClient` that every server
answers: the lists merged by table, a drop that needs the table on one server at least."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlreplay.clients.client import ReplayClient
from rlreplay.clients.shard_fan_out import ShardFanOut
from rlreplay.clients.shard_merge import merged_description
from rlreplay.wire.errors import TableNotFound

__all__ = ["drop_everywhere", "merged_tables"]


def merged_tables(urls: Sequence[str], lists: Sequence[list[dict[str, Any]]]) -> list[Any]:
    """Every table any server listed (``lists``, one per URL), each described as one."""
    found: dict[str, list[dict[str, Any]]] = {}
    holders: dict[str, list[str]] = {}
    for url, tables in zip(urls, lists, strict=True):
        for info in tables:
            found.setdefault(info["name"], []).append(info)
            holders.setdefault(info["name"], []).append(url)
    return [merged_description(holders[name], infos) for name, infos in found.items()]


async def drop_everywhere(fan_out: ShardFanOut, name: str) -> None:
    """Drop the table on every server; :class:`TableNotFound` if none had it."""

    async def drop(client: ReplayClient) -> bool:
        try:
            await client.drop_table(name)
        except TableNotFound:
            return False
        return True

    if not any(await fan_out.every(drop)):
        raise TableNotFound(f"table {name!r} does not exist on any shard")
