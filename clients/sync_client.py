"""The synchronous client: :class:`~rlreplay.clients.client.ReplayClient`'s calls, made from
plain code.

A :class:`Client` owns a :class:`~rlreplay.clients.loop_thread.LoopThread` and a
``ReplayClient`` living on it; each call runs the async call there and blocks until it is
answered. So it works where ``asyncio.run`` per call does not: from a training loop, from
several threads at once (their calls share one connection pool and run concurrently), in a
Jupyter notebook (whose main thread already runs a loop) and inside a running loop (which it
blocks while it waits, as any blocking call would; there, prefer ``ReplayClient``).

Its methods mirror ``ReplayClient``'s one for one, with the same parameters: the calls every
client shares are :class:`~rlreplay.clients.sync_calls.BlockingCalls`', the one-server calls
are here (``tests/clients/test_surface.py`` compares the signatures).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx

from rlreplay.clients.client import ReplayClient
from rlreplay.clients.sync_calls import BlockingCalls

__all__ = ["Client"]


class Client(BlockingCalls[ReplayClient]):
    """A synchronous client of one replay server (``ReplayClient``'s calls, blocking).

    Use it as a context manager (or call :meth:`close`)::

        with rlreplay.Client("http://127.0.0.1:8000") as rb:
            rb.push("default", [{"key": "k", "value": {"obs": np.zeros(4)}}])
            batch = rb.sample("default", batch_size=32)

    It runs a ``ReplayClient`` on an event loop in a thread of its own, started here and
    stopped by :meth:`close`, when the client is dropped unclosed, or at interpreter exit.
    One client may be shared by every thread of a process. After a ``fork`` (a
    ``DataLoader`` worker), make a new one in the child.

    The arguments are ``ReplayClient``'s.
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
        super().__init__(
            "rlreplay-client",
            lambda: ReplayClient(
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
            ),
        )

    def get_many_packed(self, table: str, keys: Iterable[str]) -> bytes:
        """:meth:`get_many`'s columns, their msgpack answer undecoded."""
        return self._loop.run(self._rb.get_many_packed(table, keys))

    def changes(
        self, table: str, since: int, *, limit: int = 10_000, wait_ms: int = 0
    ) -> dict[str, Any]:
        """The table's changes after event ``since`` (:meth:`ReplayClient.changes`)."""
        return self._loop.run(self._rb.changes(table, since, limit=limit, wait_ms=wait_ms))

    def table_index(self, table: str) -> dict[str, Any]:
        """The table's whole selection state (:meth:`ReplayClient.table_index`)."""
        return self._loop.run(self._rb.table_index(table))

    def snapshot(
        self, tables: Iterable[str] | None = None, *, timeout_s: float = 3600.0
    ) -> dict[str, Any]:
        """Take a snapshot to the server's backup URL (:meth:`ReplayClient.snapshot`)."""
        return self._loop.run(self._rb.snapshot(tables, timeout_s=timeout_s))

    def snapshots(self) -> list[dict[str, Any]]:
        """The complete snapshots at the server's backup URL, newest first."""
        return self._loop.run(self._rb.snapshots())
