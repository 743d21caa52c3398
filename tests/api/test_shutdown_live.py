"""SIGTERM answers the calls held waiting for other clients at once, with the contract's 503
``unavailable`` (which the client retries once the server is back), instead of keeping the
stop waiting through uvicorn's grace period and then cutting them off with a bare 500."""

from __future__ import annotations

import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.live import LiveServer, start_server, stop_server

HELD_MS = 60_000  # what the held claim asks to wait: far past every deadline below


def _wait_until_claiming(server: LiveServer, table: str, task: str) -> None:
    """Until the server lists ``task``: its claim was received (it then waits for items)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        tasks = httpx.get(f"{server.url}/v1/tables/{table}/tasks", timeout=10).json()["tasks"]
        if task in tasks:
            return
        time.sleep(0.05)
    raise AssertionError(f"the claim of task {task!r} never reached the server:\n{server.log()}")


def test_sigterm_answers_a_held_claim_503_and_the_server_exits(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        r = httpx.put(f"{server.url}/v1/tables/held", json={"sampler": {"type": "fifo"}})
        assert r.status_code == 201, r.text
        claim = {"task": "learner", "batch_size": 1, "wait_ms": HELD_MS}
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(
                httpx.post, f"{server.url}/v1/tables/held/claim", json=claim, timeout=120
            )
            _wait_until_claiming(server, "held", "learner")
            server.process.send_signal(signal.SIGTERM)
            answer = held.result(timeout=HELD_MS / 1000 - 10)  # before its own wait ends
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "unavailable", answer.text
        assert "shutting down" in answer.json()["error"]["message"]
        assert "Retry-After" in answer.headers
        try:
            assert server.process.wait(30) in (0, -signal.SIGTERM), server.log()
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the server did not exit:\n{server.log()}") from None
    finally:
        stop_server(server)
    log = server.log()
    assert "timeout graceful shutdown exceeded" not in log, log
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
