"""docker/healthcheck.py (the images' rlreplay-healthcheck): what it answers Docker, when it
ends the server, and how. tests/deploy/stack_docker.py sees it restart a real container."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import ClassVar

import pytest

from tests.deploy.files import HEALTHCHECK_SCRIPT
from tests.live import free_port


class _Probes(BaseHTTPRequestHandler):
    statuses: ClassVar[dict[str, int]] = {}

    def do_GET(self) -> None:
        self.send_response(self.statuses.get(self.path, 404))
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def probes() -> Iterator[tuple[str, dict[str, int]]]:
    statuses = {"/healthz": 200, "/readyz": 200}
    handler = type("Handler", (_Probes,), {"statuses": statuses})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", statuses
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _check(url: str, state: Path, *extra: str) -> int:
    argv = [sys.executable, str(HEALTHCHECK_SCRIPT), f"{url}/healthz", f"{url}/readyz"]
    argv += ["--state", str(state), "--kill-after", "0", *extra]
    return subprocess.run(argv, capture_output=True, timeout=60, check=False).returncode


def test_healthy_once_live_and_ready(tmp_path: Path, probes: tuple[str, dict[str, int]]) -> None:
    url, statuses = probes
    state = tmp_path / "failures"
    assert _check(url, state) == 0
    assert state.read_text() == "0"
    # Recovering or restoring: live, not ready. Unhealthy, but no liveness failure counted.
    statuses["/readyz"] = 503
    assert _check(url, state) == 1
    assert state.read_text() == "0"


def test_liveness_failures_are_counted_in_a_row(
    tmp_path: Path, probes: tuple[str, dict[str, int]]
) -> None:
    url, statuses = probes
    state = tmp_path / "failures"
    statuses["/healthz"] = 503  # the writer died
    assert [_check(url, state) for _ in range(3)] == [1, 1, 1]
    assert state.read_text() == "3"
    statuses["/healthz"] = 200
    assert _check(url, state) == 0
    assert state.read_text() == "0"
    # Nothing listens: as a failure too.
    assert _check(f"http://127.0.0.1:{free_port()}", state) == 1
    assert state.read_text() == "1"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rlreplay_healthcheck", HEALTHCHECK_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("pid1_is_an_init", "expected"), [(True, (-1, signal.SIGKILL)), (False, (1, signal.SIGTERM))]
)
def test_the_third_failure_ends_the_server(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pid1_is_an_init: bool,
    expected: tuple[int, int],
) -> None:
    """Behind an init (compose's ``init: true``), SIGKILL to every process but the init and
    the check: the init exits and the restart policy applies. Without one, SIGTERM to the
    server as PID 1, the most a process of its namespace can send it."""
    module = _module()
    here = Path("/proc/1/comm").read_text().strip()
    monkeypatch.setattr(module, "INITS", frozenset({here}) if pid1_is_an_init else frozenset())
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(module.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    dead = f"http://127.0.0.1:{free_port()}/healthz"
    state = tmp_path / "failures"
    for _ in range(2):
        assert module.main([dead, "--state", str(state), "--timeout-s", "1"]) == 1
    assert sent == []
    assert module.main([dead, "--state", str(state), "--timeout-s", "1"]) == 1
    assert sent == [expected]
