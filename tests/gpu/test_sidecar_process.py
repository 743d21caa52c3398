"""A real ``rlreplay sidecar`` process (following a server that is not there): it picks its
device and says so in its first JSON log line, closes idle and slow sockets, refuses
connections past its cap, answers 413 to a large body before reading it, asks for its own
key, and turns a bad device or variable into one line and exit status 2.

Each outcome is waited for with a generous deadline, never timed: CI machines are loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from tests.live import REPO, free_port

DEADLINE_S = 30.0
KEY = "sidecar-key"


@dataclass
class Sidecar:
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def sidecar_command(*flags: str) -> list[str]:
    return [sys.executable, "-m", "rlreplay", "sidecar", *flags]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RLREPLAY_")}


@contextlib.contextmanager
def running(tmp: Path, *flags: str) -> Iterator[Sidecar]:
    """The sidecar on 127.0.0.1, following a port nobody listens on, until /healthz answers."""
    port = free_port()
    log = tmp / f"sidecar-{port}.log"
    cmd = sidecar_command("--server", f"http://127.0.0.1:{free_port()}", "--table", "t")
    cmd += ["--host", "127.0.0.1", "--port", str(port), *flags]
    with log.open("wb") as out:
        process = subprocess.Popen(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=clean_env()
        )
    sidecar = Sidecar(port, log)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not healthy(sidecar):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield sidecar
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def healthy(sidecar: Sidecar) -> bool:
    try:
        return httpx.get(sidecar.url + "/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    flags = ["--request-head-timeout-s", "1", "--request-body-timeout-s", "1"]
    flags += ["--request-body-min-kb-per-s", "1", "--keep-alive-s", "1"]
    flags += ["--max-request-mb", "0.01", "--api-key", KEY, "--seed", "3", "--log-level", "debug"]
    with running(tmp_path_factory.mktemp("sidecar"), *flags) as s:
        yield s


def connect(sidecar: Sidecar) -> socket.socket:
    return socket.create_connection(("127.0.0.1", sidecar.port), timeout=DEADLINE_S)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the sidecar sends until it closes the connection (within the deadline)."""
    received = b""
    with sock:
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_the_first_log_line_names_the_device(sidecar: Sidecar) -> None:
    lines = sidecar.log.read_text().splitlines()
    first = json.loads(lines[0])
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert first["logger"] == "rlreplay.gpu" and first["level"] == "info", first
    assert first["device"] == expected and f"on {expected}" in first["msg"], first
    for line in lines:  # every line the server's JSON, no terminal colours
        entry = json.loads(line)
        assert list(entry)[:4] == ["ts", "level", "logger", "msg"], entry
        assert "\x1b" not in line and "color_message" not in entry, line


def test_retries_to_reach_the_server_warn_once(sidecar: Sidecar) -> None:
    """A server that is not there: a warning, then the same reason again only at debug."""

    def tries() -> list[dict[str, str]]:
        lines = [json.loads(line) for line in sidecar.log.read_text().splitlines()]
        return [e for e in lines if e["msg"].startswith("sidecar: cannot load table 't' yet")]

    deadline = time.monotonic() + DEADLINE_S
    while len(tries()) < 3:
        assert time.monotonic() < deadline, sidecar.log.read_text()
        time.sleep(0.1)
    assert [e["level"] for e in tries()[:3]] == ["warning", "debug", "debug"]


def test_an_idle_socket_is_closed(sidecar: Sidecar) -> None:
    assert read_until_closed(connect(sidecar)) == b""
    assert healthy(sidecar)


def test_a_head_that_stops_half_way_is_closed(sidecar: Sidecar) -> None:
    sock = connect(sidecar)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n")
    assert read_until_closed(sock) == b""


def test_a_body_that_stops_half_way_is_closed(sidecar: Sidecar) -> None:
    sock = connect(sidecar)
    head = (
        "POST /v1/sample HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Length: 5000\r\n\r\n"
    )
    sock.sendall(head.encode() + b'{"batch_size": 1, ')
    assert read_until_closed(sock) == b""
    assert healthy(sidecar)


def test_a_keep_alive_connection_closes_when_idle(sidecar: Sidecar) -> None:
    sock = connect(sidecar)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
    answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"status":"ok"}'), answer


def test_a_large_body_is_413_before_it_is_sent(sidecar: Sidecar) -> None:
    sock = connect(sidecar)
    head = (
        "POST /v1/sample HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Length: {25 << 20}\r\n\r\n"
    )
    sock.sendall(head.encode())
    answer = read_until_closed(sock)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413"), answer
    assert json.loads(body)["error"]["code"] == "payload_too_large"


@pytest.mark.parametrize(
    ("sent", "status"),
    [
        (b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * (70 << 10), b"431"),
        (b"\x00\x01 not http at all\r\n\r\n", b"400"),
    ],
    ids=["head-too-large", "not-http"],
)
def test_a_head_the_parser_refuses_gets_the_contracts_body(
    sidecar: Sidecar, sent: bytes, status: bytes
) -> None:
    sock = connect(sidecar)
    sock.sendall(sent)
    head, _, body = read_until_closed(sock).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status), head
    assert json.loads(body)["error"]["code"] == "bad_request"


def test_the_sidecar_asks_for_its_own_key(sidecar: Sidecar) -> None:
    sample = {"batch_size": 2}
    r = httpx.post(sidecar.url + "/v1/sample", json=sample, timeout=DEADLINE_S)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    wrong = {"authorization": "Bearer not-it"}
    r = httpx.post(sidecar.url + "/v1/sample", json=sample, headers=wrong, timeout=DEADLINE_S)
    assert r.status_code == 401
    good = {"authorization": f"Bearer {KEY}"}
    r = httpx.post(sidecar.url + "/v1/sample", json=sample, headers=good, timeout=DEADLINE_S)
    assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"  # no server


def test_connections_past_the_cap_are_closed_at_once(tmp_path: Path) -> None:
    with running(tmp_path, "--max-connections", "2", "--request-head-timeout-s", "600") as s:
        held = [connect(s), connect(s)]
        try:
            # the third is accepted by the kernel and closed by the sidecar without an answer
            assert read_until_closed(connect(s)) == b""
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + DEADLINE_S
        while not healthy(s):  # the held ones gone, room again
            assert time.monotonic() < deadline
            time.sleep(0.05)
        lines = [json.loads(line) for line in s.log.read_text().splitlines()]
        assert any(e["msg"] == "connections closed" and e["refused"] >= 1 for e in lines)


def run_cli(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = sidecar_command("--server", "http://127.0.0.1:1", "--table", "t", *flags)
    return subprocess.run(
        cmd, cwd=REPO, env=env or clean_env(), capture_output=True, text=True, timeout=120
    )


def test_a_device_torch_does_not_see_is_one_line_and_exit_2() -> None:
    unseen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    done = run_cli("--device", f"cuda:{unseen}", "--port", str(free_port()))
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rlreplay sidecar: error: --device cuda:{unseen}: "), done.stderr


def test_a_bad_variable_is_named() -> None:
    env = {**clean_env(), "RLREPLAY_SIDECAR_MAX_RESPONSE_MB": "lots"}
    done = run_cli(env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done
    assert "RLREPLAY_SIDECAR_MAX_RESPONSE_MB='lots'" in done.stderr, done.stderr
