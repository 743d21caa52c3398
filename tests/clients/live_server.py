"""Start a real ``python -m app`` server process on a free 127.0.0.1 port, for live tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def running_server(
    data_dir: Path, *extra_args: str, startup_timeout_s: float = 30.0, env: Sequence[str] = ()
) -> Iterator[str]:
    """Run the service until the block exits; yields its base URL once ``/readyz`` answers 200.

    Args:
        data_dir: The server's data directory.
        extra_args: More ``rlreplay serve`` flags.
        startup_timeout_s: How long to wait for readiness.
        env: Extra ``NAME=value`` environment entries.
    """
    port = free_port()
    log = (data_dir / "server.log").open("wb")
    environment = {**os.environ, **dict(entry.split("=", 1) for entry in env)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--data-dir",
            str(data_dir / "data"),
            *extra_args,
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environment,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"server exited with {process.returncode}: "
                    + (data_dir / "server.log").read_text(errors="replace")[-2000:]
                )
            try:
                if httpx.get(url + "/readyz", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready in time")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        log.close()
