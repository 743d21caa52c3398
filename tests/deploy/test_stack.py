"""The compose stack's ``replay`` service without Docker: the image's command line and the
compose environment, as they are, backing up to moto's S3 server in place of MinIO.

The S3 settings come through the compose file's own interpolation (``S3_ENDPOINT_URL``,
``MINIO_ROOT_USER``, ``MINIO_ROOT_PASSWORD``), the bucket is the one ``minio-init`` creates,
and the service's health check is the compose one. A node killed with SIGKILL and replaced
by one on an empty volume comes back from the newest snapshot (``RLREPLAY_RESTORE=latest``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.deploy.files import DOCKERFILE, load_compose, parse_dockerfile, service_environment
from tests.deploy.test_image import _start, _stop, _wait_ready
from tests.live import LiveServer
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
    return env


def _healthy(server: LiveServer) -> bool:
    """The compose health check's command, pointed at this server's port."""
    test = load_compose()["services"]["replay"]["healthcheck"]["test"]
    assert test[0] == "CMD"
    port = server.url.rsplit(":", 1)[1]
    argv = [arg.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for arg in test[1:]]
    if argv[0] == "python":  # the image's interpreter; here, the venv's
        argv[0] = sys.executable
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
    finally:
        _stop(second)
