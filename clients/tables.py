"""The table calls of the client: create, list, describe and drop tables, and snapshots of
the server's tables (the contract's "Tables" and "Snapshots")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlreplay.clients.requester import Requester, answer_map, table_path
from rlreplay.clients.table_config import table_config
from rlreplay.wire.schemas import SnapshotRequest

__all__ = ["Tables"]


class Tables:
    """The table and snapshot calls of :class:`~rlreplay.clients.client.ReplayClient`.

    Args:
        requester: Sends the calls to the server.
    """

    def __init__(self, requester: Requester) -> None:
        self._requester = requester

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
        return answer_map(
            await self._requester.call("PUT", table_path(name), body=config, idempotent=True)
        )

    async def list_tables(self) -> list[dict[str, Any]]:
        """Every table, each with its config and stats."""
        answer = await self._requester.call("GET", "/v1/tables", idempotent=True)
        tables = answer.get("tables", answer) if isinstance(answer, dict) else answer
        if isinstance(tables, dict):  # {name: description}
            return [{"name": name, **info} for name, info in tables.items()]
        return list(tables or [])

    async def describe_table(self, name: str) -> dict[str, Any]:
        """A table's config and stats (``size``, ``inserts``, ``samples``...).

        Raises:
            TableNotFound: No such table.
        """
        return answer_map(await self._requester.call("GET", table_path(name), idempotent=True))

    async def drop_table(self, name: str) -> None:
        """Delete a table and its data.

        Raises:
            TableNotFound: No such table.
        """
        await self._requester.call("DELETE", table_path(name), idempotent=True)

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
        answer = await self._requester.call(
            "POST", "/v1/snapshots", body=body, idempotent=False, read_timeout_s=timeout_s
        )
        return answer_map(answer)

    async def snapshots(self) -> list[dict[str, Any]]:
        """The complete snapshots at the server's backup URL, newest first."""
        answer = answer_map(await self._requester.call("GET", "/v1/snapshots", idempotent=True))
        return list(answer.get("snapshots", []))
