"""``rlreplay serve``'s uvicorn server, whose shutdown ends the calls held waiting first.

uvicorn's graceful shutdown waits for every request in flight (up to
``timeout_graceful_shutdown``) before the app's lifespan stops the engine. A claim, a sample
of an empty or rate-limited table, a reservation or a change long-poll waits for what other
clients do, for up to a minute: one such call held the whole stop for the grace period, then
was cancelled with no answer of the contract's (a bare 500, a traceback in the log). The
shutdown therefore first has the engine end those waits with 503 ``unavailable``
(:meth:`~rlreplay.app.engine.engine.Engine.end_waits`), which the client retries once the
server is back; the stop then lasts as long as the calls being served.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import uvicorn

if TYPE_CHECKING:
    from rlreplay.app.api.unix_socket import UnixListener
    from rlreplay.app.engine.engine import Engine

__all__ = ["ReplayServer"]


class ReplayServer(uvicorn.Server):
    """uvicorn's server for an app serving ``engine``: as it shuts down, the socket file of
    ``listener`` (``--uds``) goes first, so a new client is refused at once rather than half
    served, then the engine's held waits end (see the module).

    The socket file is removed there, not after ``run()`` returns: after a SIGTERM uvicorn
    raises the signal again once it has shut down, and the process ends by it.
    """

    def __init__(
        self, config: uvicorn.Config, *, engine: Engine, listener: UnixListener | None = None
    ) -> None:
        super().__init__(config)
        self.engine = engine
        self.listener = listener

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.listener is not None:
            self.listener.remove()
        self.engine.end_waits()
        await super().shutdown(sockets)
