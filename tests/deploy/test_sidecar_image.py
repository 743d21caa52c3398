"""docker/Dockerfile.sidecar: hadolint and its shape.

The compose service's command line (the same flags) runs as a local process in
tests/deploy/test_stack.py; tests/deploy/test_stack_docker.py builds and runs the image.
"""

from __future__ import annotations

import re
import subprocess
import tomllib

from tests.deploy.files import REPO, SETTING_VARIABLES, SIDECAR_DOCKERFILE, parse_dockerfile
from tests.deploy.test_image import _hadolint


def test_sidecar_dockerfile_passes_hadolint() -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", str(SIDECAR_DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_sidecar_dockerfile_shape() -> None:
    text = SIDECAR_DOCKERFILE.read_text()
    dockerfile = parse_dockerfile(text)
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, re.M)
    # The runtime's default is a CUDA PyTorch image; any Python 3.11 base with a torch
    # requirement builds it too (the stack test's CPU image).
    found = re.search(r"^ARG RUNTIME_IMAGE=(\S+)$", text, re.M)
    assert found
    assert re.fullmatch(r"pytorch/pytorch:2\.\d+\.\d+-cuda12\.\d+-cudnn9-runtime", found[1])
    assert dockerfile.stages[0] == "${BASE_IMAGE} AS requirements"
    assert dockerfile.stages[-1] == "${RUNTIME_IMAGE}"
    assert re.search(r'^ARG TORCH_REQUIREMENT=""$', text, re.M)
    assert re.search(r"^USER (?!root\b|0\b)\w+", text, re.M), "runs as a non-root user"
    assert re.search(r"^EXPOSE 8100$", text, re.M)
    assert re.search(r"^HEALTHCHECK .*\n?.*8100/healthz", text, re.M)
    assert dockerfile.cmd[:2] == ["rlreplay", "sidecar"]
    assert "COPY gpu ./gpu" in text and "COPY src ./src" in text
    # The requirements of the gpu extra, then the wheel built from the repository.
    assert "requirements.py pyproject.toml gpu > requirements.txt" in text
    assert "pip install --no-cache-dir --no-deps /wheels-out/rlreplay-*.whl" in text
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "gpu" in project["optional-dependencies"]
    assert not re.search(r"(PASSWORD|SECRET|API_KEY)", "\n".join(dockerfile.env)), "no secrets"
    assert not {k for k in dockerfile.env if k.startswith("RLREPLAY_")} - SETTING_VARIABLES


def test_the_build_context_carries_the_sidecar_package() -> None:
    ignored = (REPO / ".dockerignore").read_text().split()
    assert "gpu/" not in ignored and "gpu" not in ignored
