"""Server URLs: ``http://host:port``, ``https://...``, or ``unix:///path/to.sock``.

A ``unix://`` URL names the Unix domain socket of a server on the same host (``rlreplay
serve --uds /path/to.sock``); everything after ``unix://`` is the socket's path, so
``unix:///run/rlreplay/replay.sock`` is the absolute path ``/run/rlreplay/replay.sock``. Its
requests are plain HTTP/1.1 with ``Host: localhost``.
"""

from __future__ import annotations

from typing import Final, NamedTuple

__all__ = ["UNIX_SCHEME", "ServerAddress", "server_address"]

UNIX_SCHEME: Final = "unix://"
#: The base URL of requests sent over a Unix socket (the ``Host`` header they carry).
_UNIX_BASE: Final = "http://localhost"


class ServerAddress(NamedTuple):
    """Where requests go: the base URL of their paths, and the Unix socket (or None: TCP)."""

    base_url: str
    uds: str | None


def server_address(url: str) -> ServerAddress:
    """The base URL and Unix socket path of a server URL.

    Raises:
        ValueError: A ``unix://`` URL without a path.
    """
    if url[: len(UNIX_SCHEME)].lower() != UNIX_SCHEME:
        return ServerAddress(url, None)
    path = url[len(UNIX_SCHEME) :]
    if not path:
        raise ValueError(f"server URL {url!r} names no socket path (unix:///path/to.sock)")
    return ServerAddress(_UNIX_BASE, path)
