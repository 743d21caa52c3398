"""The server's Unix domain socket: ``rlreplay serve --uds PATH``.

A trainer on the same host reaches the server through a socket file instead of TCP: no TCP
stack, no loopback checksums, about four times the bandwidth of 127.0.0.1 between two Python
processes on the machines measured (``python -m bench bulk``). The socket is served by the
same HTTP protocol, with the same deadlines and connection cap
(:mod:`rlreplay.app.api.connections`), as the TCP port.

The socket file:

* is created with mode ``0660`` (owner and group may connect), before the server listens;
* replaces a stale one, left by a server that was killed (nothing accepts on it), at start,
  and refuses to start when a server is still listening on it or when the path is some
  other kind of file;
* is removed when the server stops, unless another file has taken its place meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

import uvicorn

__all__ = [
    "SOCKET_MODE",
    "UnixListener",
    "UnixSocketInUse",
    "UnixSocketServer",
    "check_unix_socket",
]

#: Owner and group may connect (connecting needs write permission on the file).
SOCKET_MODE = 0o660


class UnixSocketInUse(OSError):
    """The path is a socket a live server accepts on, or a file that is not a socket."""


def check_unix_socket(path: Path) -> None:
    """Refuses a path the server must not take: a live socket, or another kind of file.

    A stale socket (nothing accepts on it) passes: :func:`bind_unix_socket` replaces it.

    Raises:
        UnixSocketInUse: The path is taken; the message says by what.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise UnixSocketInUse(f"{str(path)!r} exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return  # stale: nobody listens
        except OSError:
            return  # not ours to judge (a permission error): binding will say
    raise UnixSocketInUse(f"a server is already listening on {str(path)!r}")


class UnixListener:
    """A Unix stream socket bound at a path (mode ``0660``), not yet listening; uvicorn
    listens on :attr:`sock`, and :meth:`remove` takes the file away at stop."""

    def __init__(self, path: Path) -> None:
        """Binds ``path``, replacing a stale socket there.

        Raises:
            UnixSocketInUse: See :func:`check_unix_socket`.
            OSError: The path cannot be bound (a missing folder, permissions, too long).
        """
        check_unix_socket(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # stale
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.bind(str(path))
            os.chmod(path, SOCKET_MODE)  # before listen(): nobody can have connected yet
            self._inode = os.stat(path).st_ino
        except BaseException:
            self.sock.close()
            raise

    def remove(self) -> None:
        """Removes the socket file, unless another file took its place (the socket itself
        is closed by whoever listens on it); calling it again does nothing."""
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)


class UnixSocketServer(uvicorn.Server):
    """uvicorn's server, removing the socket file of ``listener`` as it shuts down.

    Removed there, not after ``run()`` returns: after a SIGTERM uvicorn raises the signal
    again once it has shut down, and the process ends by it.
    """

    def __init__(self, config: uvicorn.Config, listener: UnixListener) -> None:
        super().__init__(config)
        self.listener = listener

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.listener.remove()  # first: a new client is refused at once, not half-served
        await super().shutdown(sockets)
