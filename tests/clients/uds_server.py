"""A live ``rlreplay serve`` on 127.0.0.1 and on a Unix socket, for the tests over the socket."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live import LiveServer, running_server


@pytest.fixture(scope="module")
def live_uds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, str]]:
    """The server and its socket's URL (the socket in a short folder: a socket's path is
    limited to about 100 bytes, and pytest's folders can be longer)."""
    with tempfile.TemporaryDirectory(prefix="rlr") as folder:
        sock = Path(folder) / "replay.sock"
        with running_server(tmp_path_factory.mktemp("uds"), "--uds", str(sock)) as server:
            yield server, f"unix://{sock}"
