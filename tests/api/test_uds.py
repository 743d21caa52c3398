"""``rlreplay serve --uds PATH``: the socket file's life (mode 0660, a stale one replaced, a
live one or another file refused, removed at stop), ``--no-tcp``, the connection rules on
the socket, and the columnar round trips over TCP and over the socket alike."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlreplay.clients import ReplayClient
from tests.api.test_columns_roundtrip import batches, check_round_trips
from tests.live import REPO, LiveServer, launch_server, running_server, stop_server

_TABLES = itertools.count()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a socket's path is limited to about 100 bytes."""
    with tempfile.TemporaryDirectory(prefix="rlr") as folder:
        yield Path(folder)


def _wait(condition: Callable[[], bool], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _healthz(path: Path) -> int | None:
    """The status of ``GET /healthz`` over the socket, or None when it cannot connect."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5)
        try:
            conn.connect(str(path))
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            head = conn.recv(4096)
        except OSError:
            return None
    return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else None


def _serve(workdir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``rlreplay serve`` run to its end (a start-up refusal)."""
    cmd = [sys.executable, "-m", "rlreplay.app", "--data-dir", str(workdir / "data"), *flags]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLREPLAY_")}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60, env=env)


def test_the_socket_is_0660_serves_and_is_removed_at_stop(tmp_path: Path, short_dir: Path) -> None:
    sock = short_dir / "replay.sock"
    with running_server(tmp_path, "--storage-mode", "memory", "--uds", str(sock)) as server:
        assert stat.S_ISSOCK(os.stat(sock).st_mode)
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o660
        assert _healthz(sock) == 200
        assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200  # TCP too
        stop_server(server)
        assert not sock.exists()


def test_a_stale_socket_is_replaced(tmp_path: Path, short_dir: Path) -> None:
    sock = short_dir / "replay.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))  # as a killed server leaves it: a file nobody accepts on
    stale.close()
    with running_server(tmp_path, "--storage-mode", "memory", "--uds", str(sock)):
        assert _healthz(sock) == 200


def test_a_socket_in_use_or_another_file_is_refused(tmp_path: Path, short_dir: Path) -> None:
    sock = short_dir / "replay.sock"
    with running_server(tmp_path / "a", "--storage-mode", "memory", "--uds", str(sock)):
        done = _serve(tmp_path / "b", "--port", "0", "--uds", str(sock))
        assert done.returncode == 2
        assert "already listening" in done.stderr
        assert _healthz(sock) == 200  # the first server keeps it
    plain = short_dir / "plain"
    plain.write_text("keep me")
    done = _serve(tmp_path / "c", "--port", "0", "--uds", str(plain))
    assert done.returncode == 2
    assert "not a socket" in done.stderr
    assert plain.read_text() == "keep me"


def test_no_tcp_needs_a_socket_and_serves_only_it(tmp_path: Path, short_dir: Path) -> None:
    done = _serve(tmp_path / "a", "--no-tcp")
    assert done.returncode == 2
    assert "--no-tcp needs --uds" in done.stderr
    sock = short_dir / "replay.sock"
    server = launch_server(
        tmp_path / "b", "--storage-mode", "memory", "--uds", str(sock), "--no-tcp"
    )
    try:
        assert _wait(lambda: _healthz(sock) == 200), server.log()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.url}/healthz", timeout=2)
    finally:
        stop_server(server)
    assert not sock.exists()


def test_the_connection_cap_holds_on_the_socket(tmp_path: Path, short_dir: Path) -> None:
    sock_path = short_dir / "replay.sock"
    flags = ("--storage-mode", "memory", "--max-connections", "4", "--uds", str(sock_path))
    with running_server(tmp_path, *flags), contextlib.ExitStack() as stack:
        held: list[socket.socket] = []
        for _ in range(200):  # the readiness probes' connections may take a moment to go
            if len(held) == 4:
                break
            conn = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            conn.settimeout(10)
            conn.connect(str(sock_path))
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
            try:
                answer = conn.recv(4096)
            except ConnectionError:
                answer = b""
            if answer.startswith(b"HTTP/1.1 200"):
                held.append(conn)
            else:
                time.sleep(0.1)
        assert len(held) == 4
        extra = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        extra.settimeout(10)
        extra.connect(str(sock_path))
        with contextlib.suppress(ConnectionError):
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        try:
            refused = extra.recv(4096)
        except ConnectionError:
            refused = b""
        assert refused == b""  # closed at once, without an answer


@pytest.fixture(scope="module")
def live_uds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Path]]:
    with tempfile.TemporaryDirectory(prefix="rlr") as folder:
        sock = Path(folder) / "replay.sock"
        workdir = tmp_path_factory.mktemp("uds")
        with running_server(workdir, "--storage-mode", "memory", "--uds", str(sock)) as server:
            yield server, sock


@pytest.fixture(params=["tcp", "unix"])
async def live_client(
    request: pytest.FixtureRequest, live_uds: tuple[LiveServer, Path]
) -> AsyncIterator[httpx.AsyncClient]:
    server, sock = live_uds
    if request.param == "tcp":
        client = httpx.AsyncClient(base_url=server.url, timeout=30)
    else:
        transport = httpx.AsyncHTTPTransport(uds=str(sock))
        client = httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=30)
    async with client:
        yield client


@given(batch=batches(), fmt=st.sampled_from(["msgpack", "json"]))
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
async def test_columns_round_trip_bit_exactly_over_tcp_and_the_socket(
    live_client: httpx.AsyncClient, batch: dict[str, Any], fmt: str
) -> None:
    n = next(iter(batch.values())).shape[0]
    keys = [f"k{i}" for i in range(n)]
    cols, per = f"cols{next(_TABLES)}", f"rows{next(_TABLES)}"
    for table in (cols, per):
        r = await live_client.put(f"/v1/tables/{table}", json={"sampler": {"type": "uniform"}})
        assert r.status_code == 201
    try:
        await check_round_trips(live_client, batch, fmt, keys, cols, per)
    finally:
        for table in (cols, per):
            await live_client.delete(f"/v1/tables/{table}")


def _queued(conn: socket.socket) -> int:
    """Bytes waiting in ``conn``'s receive queue, sent but not read yet."""
    return struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


async def test_an_answer_waits_in_the_socket_by_the_mib(live_uds: tuple[LiveServer, Path]) -> None:
    """The server's Unix-socket connections send with a buffer of MiBs, not the system's
    ~208 KiB, so a long answer crosses in a few rounds of wake-ups rather than some 80:
    a client that does not read finds more than 1 MiB of the answer waiting."""
    _, sock = live_uds
    table = f"big{next(_TABLES)}"
    async with ReplayClient(f"unix://{sock}") as rb:
        await rb.create_table(table)
        value = {"x": np.arange(4 << 20, dtype=np.uint8)}
        await rb.push(table, [{"key": "k", "value": value}], wait=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(str(sock))
        head = f"GET /v1/tables/{table}/items/k HTTP/1.1\r\nHost: a\r\n"
        conn.sendall(head.encode() + b"Accept: application/msgpack\r\n\r\n")
        assert _wait(lambda: _queued(conn) > 1 << 20), _queued(conn)
