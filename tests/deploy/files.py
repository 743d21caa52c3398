"""Readers of the deployment files (docker-compose.yml, docker/Dockerfile, deploy/k8s) that
the deployment tests share."""

from __future__ import annotations

import json
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlreplay.app.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker/Dockerfile"
SIDECAR_DOCKERFILE = REPO / "docker/Dockerfile.sidecar"
MOTO_DOCKERFILE = REPO / "tests/deploy/Dockerfile.moto"
PROMETHEUS_DOCKERFILE = REPO / "tests/deploy/Dockerfile.prometheus"
REQUIREMENTS_SCRIPT = REPO / "docker/requirements.py"
HEALTHCHECK_SCRIPT = REPO / "docker/healthcheck.py"
COMPOSE_FILE = REPO / "docker-compose.yml"
CPU_OVERRIDE = REPO / "docker-compose.cpu.yml"
K8S_DIR = REPO / "deploy/k8s"
#: Setting names as environment variables (``RLREPLAY_DATA_DIR``...).
SETTING_VARIABLES = frozenset(f"RLREPLAY_{name.upper()}" for name in Settings.model_fields)

_INTERPOLATION = re.compile(
    r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<default>[^}]*))?\}|\$(?P<bare>\w+)"
)


class Reset:
    """Compose's ``!reset`` tag: the key is dropped from what the file overrides."""


class _ComposeLoader(yaml.SafeLoader):
    """YAML as Compose reads it, for what these files use: plain YAML and ``!reset``."""


_ComposeLoader.add_constructor("!reset", lambda loader, node: Reset())


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    data = yaml.load(path.read_text(), Loader=_ComposeLoader)
    assert isinstance(data, dict)
    return data


def merge_compose(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``docker compose -f base -f override`` for what these files use: maps merge key by
    key, a ``!reset`` drops the key, and anything else (a command, a list) replaces."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Reset):
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_compose(merged[key], value)
        else:
            merged[key] = value
    return merged


def interpolate(text: str, environ: Mapping[str, str]) -> str:
    """``${VAR}``, ``${VAR:-default}`` and ``$VAR`` as Compose substitutes them (``$$`` is a
    literal ``$``)."""

    def one(match: re.Match[str]) -> str:
        name = match["name"] or match["bare"]
        value = environ.get(name)
        if match["op"] in (":-", ":?") and not value:
            return match["default"] or ""
        if match["op"] in ("-", "?") and value is None:
            return match["default"] or ""
        return value or ""

    parts = text.split("$$")
    return "$".join(_INTERPOLATION.sub(one, part) for part in parts)


def service_environment(service: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """A compose service's ``environment`` (map or list form), interpolated."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {k: interpolate("" if v is None else str(v), environ) for k, v in env.items()}


@dataclass
class Dockerfile:
    """The instructions of the final stage that the service's command line depends on."""

    env: dict[str, str] = field(default_factory=dict)
    cmd: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)


def socket_volume(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the Unix socket that compose puts on its ``replay-socket`` volume
    (``RLREPLAY_UDS=/run/rlreplay/...``) moved into a new short temporary folder: a server
    run here, outside the container, cannot create ``/run/rlreplay``, and a socket's path
    must stay under 108 bytes, which pytest's folders may not."""
    uds = env.get("RLREPLAY_UDS")
    if uds:
        env["RLREPLAY_UDS"] = str(Path(tempfile.mkdtemp(prefix="rlr-uds-")) / Path(uds).name)
    return env


def _instructions(text: str) -> Iterator[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with continuation lines joined and comments dropped."""
    logical = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        keyword, _, rest = logical.partition(" ")
        yield keyword.upper(), rest.strip()
        logical = ""


def _exec_form(arguments: str) -> list[str]:
    value = json.loads(arguments) if arguments.startswith("[") else ["/bin/sh", "-c", arguments]
    assert isinstance(value, list)
    return [str(v) for v in value]


def parse_dockerfile(text: str) -> Dockerfile:
    """ENV, CMD and ENTRYPOINT of the last stage (``ENV`` in ``key=value`` form, ``$VAR``
    references to earlier values expanded)."""
    parsed = Dockerfile()
    for keyword, arguments in _instructions(text):
        if keyword == "FROM":
            parsed.stages.append(arguments)
            parsed.env, parsed.cmd, parsed.entrypoint = {}, [], []
        elif keyword == "ENV":
            for pair in shlex.split(arguments):
                key, sep, value = pair.partition("=")
                assert sep, f"ENV {pair!r}: use the key=value form"
                parsed.env[key] = interpolate(value, parsed.env)
        elif keyword == "CMD":
            parsed.cmd = _exec_form(arguments)
        elif keyword == "ENTRYPOINT":
            parsed.entrypoint = _exec_form(arguments)
    return parsed


def healthcheck_argv(test: list[str], port: int, state: Path) -> list[str]:
    """A compose health check's ``CMD`` run here: the images' ``rlreplay-healthcheck`` is
    docker/healthcheck.py under this interpreter, pointed at 127.0.0.1:``port``, its failure
    count in ``state`` and never ending anything (PID 1 here is not the server)."""
    assert test[0] == "CMD" and test[1] == "rlreplay-healthcheck", test
    argv = [re.sub(r"127\.0\.0\.1:\d+/", f"127.0.0.1:{port}/", arg) for arg in test[2:]]
    return [
        sys.executable,
        str(HEALTHCHECK_SCRIPT),
        *argv,
        "--state",
        str(state),
        "--kill-after",
        "0",
    ]


def k8s_documents() -> list[tuple[Path, dict[str, Any]]]:
    """Every resource that kustomization.yaml lists, with the file it is in."""
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        path = K8S_DIR / name
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path, doc))
    return docs
