"""The compose stack's ``replay`` service without Docker: the image's command line and the
compose environment, as they are, backing up to moto's S3 server in place of MinIO.

The S3 settings come through the compose file's own interpolation (``S3_ENDPOINT_URL``,
``MINIO_ROOT_USER``, ``MINIO_ROOT_PASSWORD``), the bucket is the one ``minio-init`` creates,
and the service's health check is the compose one. A node killed with SIGKILL and replaced
by one on an empty volume comes back from the newest snapshot (``RLREPLAY_RESTORE=latest``).
The ``sidecar`` service's command line (with the CPU override, as on a machine without a
GPU) then follows the restored node and serves samples of its values.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgpack
import pytest

from rlreplay.wire.codec import unpackb
from tests.deploy.files import (
    CPU_OVERRIDE,
    DOCKERFILE,
    healthcheck_argv,
    interpolate,
    load_compose,
    merge_compose,
    parse_dockerfile,
    service_environment,
    socket_volume,
)
from tests.deploy.test_image import _start, _stop, _wait_ready
from tests.live import LiveServer, free_port
from tests.s3server import KEY, SECRET, create_bucket, start_moto


@pytest.fixture
def s3() -> Iterator[str]:
    server, endpoint = start_moto()
    try:
        yield endpoint
    finally:
        server.stop()


def _stack_environment(data_dir: Path, endpoint: str) -> dict[str, str]:
    """The image's ENV, then the compose ``replay`` environment interpolated as ``docker
    compose up`` would with these variables set (moto's endpoint and credentials)."""
    given = {"S3_ENDPOINT_URL": endpoint, "MINIO_ROOT_USER": KEY, "MINIO_ROOT_PASSWORD": SECRET}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLREPLAY_", "AWS_"))}
    image_env = parse_dockerfile(DOCKERFILE.read_text()).env
    env.update({k: v for k, v in image_env.items() if k != "PATH"})
    env.update(service_environment(load_compose()["services"]["replay"], given))
    env["RLREPLAY_DATA_DIR"] = str(data_dir)  # the volume
    return socket_volume(env)


def _healthy(server: LiveServer) -> bool:
    """The compose health check's command, pointed at this server's port."""
    test = load_compose()["services"]["replay"]["healthcheck"]["test"]
    port = int(server.url.rsplit(":", 1)[1])
    argv = healthcheck_argv(test, port, server.data_dir.parent / "replay-health")
    return subprocess.run(argv, timeout=30, check=False).returncode == 0


def _bucket() -> str:
    init = " ".join(load_compose()["services"]["minio-init"]["entrypoint"])
    found = re.search(r"mc mb --ignore-existing local/([\w.-]+)", init)
    assert found
    return found[1]


def test_stack_backs_up_to_s3_and_a_new_node_restores_after_a_kill(tmp_path: Path, s3: str) -> None:
    create_bucket(s3, _bucket())  # what minio-init does
    env = _stack_environment(tmp_path / "volume-1", s3)
    assert env["RLREPLAY_BACKUP_URL"].startswith(f"s3://{_bucket()}/")
    assert env["AWS_ENDPOINT_URL"] == s3 and env["RLREPLAY_RESTORE"] == "latest"

    first = _start(tmp_path, env)
    try:
        _wait_ready(first)  # restore latest on an empty bucket: starts empty
        assert _healthy(first)
        items = [{"key": f"k{i}", "value": {"i": i}} for i in range(50)]
        pushed = httpx.post(
            f"{first.url}/v1/tables/default/items",
            json={"items": items, "wait": True},
            timeout=30,
        )
        assert pushed.is_success, pushed.text
        snapshot = httpx.post(f"{first.url}/v1/snapshots", json={}, timeout=60)
        assert snapshot.is_success, snapshot.text
        assert snapshot.json()["url"].startswith(env["RLREPLAY_BACKUP_URL"])
    finally:
        first.process.kill()  # the node is lost: SIGKILL, and its volume with it
        first.process.wait(15)

    second = _start(tmp_path, _stack_environment(tmp_path / "volume-2", s3))
    try:
        _wait_ready(second, timeout_s=60)
        assert _healthy(second)
        got = httpx.post(
            f"{second.url}/v1/tables/default/items:batchGet",
            json={"keys": [f"k{i}" for i in range(50)]},
            timeout=30,
        )
        assert [item["value"]["i"] for item in got.json()["items"]] == list(range(50))
        _sidecar_serves_samples_of(second, tmp_path)
    finally:
        _stop(second)


def _sidecar_command(server_url: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The ``sidecar`` service's command and environment with the CPU override, pointed at
    ``server_url`` instead of the replay service's Unix socket and bound to
    127.0.0.1:``port``."""
    compose = merge_compose(load_compose(), load_compose(CPU_OVERRIDE))
    service = compose["services"]["sidecar"]
    assert "deploy" not in service  # no GPU reservation on the CPU
    argv = [interpolate(str(arg), {}) for arg in service["command"]]
    assert argv[:2] == ["rlreplay", "sidecar"]
    assert argv[argv.index("--server") + 1] == "unix:///run/rlreplay/rlreplay.sock"
    assert argv[argv.index("--device") + 1] == "cpu"
    argv[argv.index("--server") + 1] = server_url
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = str(port)
    argv[0] = str(Path(sys.executable).parent / "rlreplay")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLREPLAY_")}
    env.update(service_environment(service, {}))  # RLREPLAY_API_KEY unset: no key
    return argv, env


def _sidecar_serves_samples_of(server: LiveServer, workdir: Path) -> None:
    port = free_port()
    argv, env = _sidecar_command(server.url, port)
    url = f"http://127.0.0.1:{port}"
    log_path = workdir / "sidecar.log"
    with log_path.open("wb") as log:
        sidecar = subprocess.Popen(argv, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120  # torch's import is slow on a loaded machine
        ready = False
        while not ready and time.monotonic() < deadline:
            assert sidecar.poll() is None, log_path.read_text()
            with contextlib.suppress(httpx.HTTPError):
                ready = httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            time.sleep(0.2)
        assert ready, log_path.read_text()
        test = load_compose()["services"]["sidecar"]["healthcheck"]["test"]
        check = healthcheck_argv(test, port, workdir / "sidecar-health")
        assert subprocess.run(check, timeout=30, check=False).returncode == 0
        answer = httpx.post(
            f"{url}/v1/sample",
            content=msgpack.packb({"batch_size": 16, "strategy": "uniform", "fields": ["i"]}),
            headers={"Content-Type": "application/msgpack", "Accept": "application/msgpack"},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        batch = unpackb(answer.content)
        keys = batch["keys"]
        assert len(keys) == 16
        assert list(batch["columns"]["i"]) == [int(key[1:]) for key in keys]
    finally:
        sidecar.terminate()
        try:
            sidecar.wait(30)
        except subprocess.TimeoutExpired:
            sidecar.kill()
            sidecar.wait(10)
