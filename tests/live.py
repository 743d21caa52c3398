"""Real ``rlreplay serve`` subprocesses for the live tests: a free port on 127.0.0.1, a data
directory under the test's folder, the log kept in ``server.log``, stopped at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from rlreplay.app.cli import serve_command

REPO = Path(__file__).resolve().parents[1]


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


def start_server(
    workdir: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    data_dir: Path | None = None,
    port: int | None = None,
) -> LiveServer:
    """Starts ``python -m rlreplay.app`` on 127.0.0.1 and waits until ``/readyz`` answers 200."""
    server = launch_server(workdir, *flags, env=env, data_dir=data_dir, port=port)
    wait_ready(server, 30)
    return server


def start_servers(specs: Sequence[tuple[Path, Sequence[str]]]) -> list[LiveServer]:
    """Starts one server per ``(workdir, flags)`` at once (their start-ups overlap) and waits
    until each is ready; stops them all if one does not start."""
    servers = [launch_server(workdir, *flags) for workdir, flags in specs]
    try:
        for server in servers:
            wait_ready(server, 60)  # the others start alongside it
    except BaseException:
        for server in servers:
            stop_server(server)
        raise
    return servers


def wait_ready(server: LiveServer, timeout_s: float) -> None:
    """Waits until ``/readyz`` answers 200; stops the server and raises if it exits first or
    ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/readyz", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    stop_server(server)
    raise RuntimeError(f"server not ready in {timeout_s:g} s:\n{server.log()}")


def launch_server(
    workdir: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    data_dir: Path | None = None,
    port: int | None = None,
) -> LiveServer:
    """Starts ``python -m rlreplay.app`` on 127.0.0.1 without waiting for it (data in
    ``workdir/data`` unless ``data_dir`` is given; the log in ``workdir/server.log``; on a
    free port unless ``port`` is given, as a restart on the same URL needs)."""
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    data_dir = data_dir or workdir / "data"
    log_path = workdir / "server.log"
    cmd = serve_command(port, data_dir, *flags)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLREPLAY_")}
    full_env.update(env or {})
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=full_env
        )
    return LiveServer(f"http://127.0.0.1:{port}", process, log_path, data_dir)


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
