"""The idle keep-alive connections of :class:`~rlreplay.clients.transport.LeanTransport`, per
address.

Reusing a connection saves a TCP handshake per request; this module decides which idle one
to reuse (the newest that is not stale), how many to keep, and opens fresh ones.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from rlreplay.clients.connection import Connection
from rlreplay.wire.buffer_pool import BufferPool

__all__ = ["Address", "ConnectionPool"]

Address = tuple[str, int]


class ConnectionPool:
    """Idle connections kept per ``(host, port)``, reused last-in first-out.

    Args:
        max_idle: Idle connections kept per ``(host, port)``; the oldest is closed to make
            room for another.
        expiry: Seconds an idle connection may wait before it is closed instead of reused.
        uds: Connect to this Unix domain socket rather than to the address over TCP.
        buffers: Where the connections read long bodies (see :class:`Connection`).
    """

    def __init__(
        self,
        *,
        max_idle: int,
        expiry: float,
        uds: str | None = None,
        buffers: BufferPool | None = None,
    ) -> None:
        self._max_idle = max_idle
        self._uds = uds
        self._buffers = buffers
        self._expiry = expiry
        self._idle: dict[Address, list[Connection]] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    def idle_connections(self) -> int:
        """How many idle connections the pool holds, over every ``(host, port)``."""
        return sum(len(pool) for pool in self._idle.values())

    async def aclose(self) -> None:
        """Close the idle connections; connections checked in later are closed at once.

        Calling it again does nothing.
        """
        self._closed = True
        idle = [conn for pool in self._idle.values() for conn in pool]
        self._idle.clear()
        for conn in idle:
            conn.close()
        for conn in idle:
            try:
                async with asyncio.timeout(1.0):
                    await conn.wait_closed()
            except (OSError, TimeoutError):
                pass

    def checkout(self, address: Address) -> Connection | None:
        """The newest idle connection to ``address`` that is not stale, or None."""
        pool = self._idle.get(address)
        if not pool:
            return None
        now = time.monotonic()
        while pool:
            conn = pool.pop()
            if not conn.is_stale(now, self._expiry):
                return conn
            conn.close()
        return None

    def checkin(self, address: Address, conn: Connection) -> None:
        """Keep ``conn``, which has just served a complete answer, for reuse (or close it)."""
        if self._closed or self._max_idle == 0:
            conn.close()
            return
        conn.reused = True
        conn.idle_since = time.monotonic()
        pool = self._idle.setdefault(address, [])
        if len(pool) >= self._max_idle:
            pool.pop(0).close()  # the oldest idle one: the likeliest to go stale
        pool.append(conn)

    async def connect(self, address: Address, timeout_s: float | None) -> Connection:
        """A fresh connection to ``address`` (or to the pool's Unix socket).

        Raises:
            httpx.ConnectTimeout: Connecting took longer than ``timeout_s``.
            httpx.ConnectError: The connection was refused, unreachable, or DNS failed.
        """
        host, port = address
        where = f"{host}:{port}" if self._uds is None else f"unix socket {self._uds}"
        try:
            async with asyncio.timeout(timeout_s):
                loop = asyncio.get_running_loop()
                if self._uds is None:
                    _, conn = await loop.create_connection(self._connection, host, port)
                else:
                    _, conn = await loop.create_unix_connection(self._connection, self._uds)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {where} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {where}: {exc}") from exc
        return conn

    def _connection(self) -> Connection:
        return Connection(asyncio.get_running_loop(), self._buffers)
