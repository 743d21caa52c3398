"""Fixtures of the HTTP tests: an in-process app over ``httpx.ASGITransport``, and real
``rlreplay serve`` subprocesses on 127.0.0.1 (free port, temp data dir, stopped at the end)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.main import create_app
from app.settings import Settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings of an in-process app: memory mode, a temp data dir, a 1 MiB request limit."""
    return Settings(data_dir=tmp_path / "data", storage_mode="memory", max_request_mb=1)


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    """The app with its lifespan running (engine started, ``default`` table created)."""
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client talking to the in-process app."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        yield c


def free_port() -> int:
    """A port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class LiveServer:
    """A running ``rlreplay serve`` subprocess."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    data_dir: Path

    def log(self) -> str:
        """What the server wrote on stderr so far."""
        return self.log_path.read_text(errors="replace")


def start_server(workdir: Path, *flags: str, env: dict[str, str] | None = None) -> LiveServer:
    """Starts ``python -m app`` on 127.0.0.1 and waits until ``/readyz`` answers 200."""
    port = free_port()
    data_dir = workdir / "data"
    log_path = workdir / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *flags,
    ]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLREPLAY_")}
    full_env.update(env or {})
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=full_env
        )
    server = LiveServer(f"http://127.0.0.1:{port}", process, log_path, data_dir)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.log()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/readyz", timeout=1).status_code == 200:
                return server
        time.sleep(0.1)
    stop_server(server)
    raise RuntimeError(f"server not ready in 30 s:\n{server.log()}")


def stop_server(server: LiveServer) -> int:
    """SIGTERM, then SIGKILL after 15 s; returns the exit code."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(15)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(5)
    return server.process.returncode


@contextlib.contextmanager
def running_server(workdir: Path, *flags: str, **kwargs: Any) -> Iterator[LiveServer]:
    """A live server for the duration of the block."""
    server = start_server(workdir, *flags, **kwargs)
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The main live server: hybrid storage, WAL, a 1 MiB request limit."""
    with running_server(tmp_path_factory.mktemp("live"), "--max-request-mb", "1") as server:
        yield server


@pytest.fixture(scope="session")
def live_keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A live server with two API keys, in memory mode."""
    with running_server(
        tmp_path_factory.mktemp("keys"),
        "--storage-mode",
        "memory",
        "--api-key",
        "key-one",
        "--api-key",
        "key-two",
    ) as server:
        yield server
