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

Each connection accepted on it gets a send buffer of :data:`SEND_BUFFER_BYTES`
(:func:`widen_send_buffer`). A Unix stream socket holds no more than its sender's
``SO_SNDBUF`` (the receiver's ``SO_RCVBUF`` plays no part): at Linux's default, about 208
KiB, a 16 MiB answer crosses in some 80 rounds, each a wake-up of the client and then of
the server, and whenever the scheduler is slow to run one of them (a busy core, a virtual
CPU woken from idle) every round waits for it, so that a read fell to a tenth of the
socket's bandwidth for seconds at a time while TCP, whose loopback buffers grow to MiBs,
took a few rounds. With 1 MiB (the kernel doubles it) a 16 MiB answer takes about 16.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from pathlib import Path

__all__ = [
    "SEND_BUFFER_BYTES",
    "SOCKET_MODE",
    "UnixListener",
    "UnixSocketInUse",
    "check_unix_socket",
    "widen_send_buffer",
]

#: Owner and group may connect (connecting needs write permission on the file).
SOCKET_MODE = 0o660


#: ``SO_SNDBUF`` of each connection accepted on the Unix socket (see the module); 0: the
#: system's default.
SEND_BUFFER_BYTES = 1 << 20


def widen_send_buffer(transport: asyncio.BaseTransport) -> bool:
    """Gives a Unix-socket connection's socket a send buffer of :data:`SEND_BUFFER_BYTES`
    (never less than the one it has); any other connection is left as it is.

    Returns:
        Whether the buffer was set.
    """
    sock = transport.get_extra_info("socket")
    if SEND_BUFFER_BYTES <= 0 or sock is None or sock.family != socket.AF_UNIX:
        return False
    try:
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= 2 * SEND_BUFFER_BYTES:
            return False
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    except OSError:  # a socket closed under us: its connection is ending anyway
        return False
    return True


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
