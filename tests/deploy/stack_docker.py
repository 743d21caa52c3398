"""The compose stack for real: `make stack-test` (tests/deploy/stack-test.sh) builds the images
and runs this file; the plain suite does not collect it (it needs a Docker engine, root and
minutes).

docker-compose.yml with docker-compose.cpu.yml (the sidecar on the CPU) and
tests/deploy/compose.stack.yml (moto's S3 server in place of MinIO, health checks every 2 s)
starts the service, the sidecar, the S3 server and Prometheus (Debian's package in place of
prom/prometheus). Through the published ports, on 127.0.0.1 only, the Python client pushes,
samples and takes a snapshot, and Prometheus has scraped both the server and the sidecar.
Then:

1. The server is frozen (SIGSTOP): /healthz stops answering, the health check ends the
   process after three failures, and `restart: unless-stopped` brings the container back on
   its volume, with every acknowledged item (the write-ahead log's recovery).
2. The node is lost: the container is killed with SIGKILL, its volume removed, and the
   service started again; `RLREPLAY_RESTORE=latest` restores the snapshot from S3 and
   every item answered before it is back, value for value.
3. The sidecar, which followed the server through both, serves samples whose columns are
   the values of their keys.

Compose: `docker compose` (v2) when the engine's client has it, else Debian's
`docker-compose` (1.29), which cannot read `!reset` (Compose 2.24.4 and later): for it the
CPU override is merged into the compose file here, as v2 merges them (tests/deploy/files.py),
and the result handed over as one file.

`python -m tests.deploy.stack_docker --down` removes what a run left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest
import yaml

from rlreplay import ReplayClient
from rlreplay.wire.codec import unpackb
from rlreplay.wire.errors import ReplayError
from tests.deploy.files import (
    COMPOSE_FILE,
    CPU_OVERRIDE,
    REPO,
    load_compose,
    merge_compose,
)
from tests.live import free_port

STACK_OVERRIDE = REPO / "tests/deploy/compose.stack.yml"
#: Grafana's image is the one left out (it cannot be pulled here); naming Prometheus starts it
#: without the whole "monitoring" profile.
SERVICES = ("replay", "sidecar", "minio", "minio-init", "prometheus")
PROJECT = "rlreplay-stack-test"
TABLE = "default"
ITEMS = 400
#: Every wait's bound, in seconds (generous: the machine may be shared and loaded).
START_S = 240
RESTART_S = 180


def _v2_available() -> bool:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        return probe.returncode == 0
    return False


@dataclass
class Stack:
    """One compose project: the command line that reaches it, its ports and timings."""

    workdir: Path
    ports: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if _v2_available():
            files = [COMPOSE_FILE, CPU_OVERRIDE, STACK_OVERRIDE]
            command = ["docker", "compose"]
        else:
            assert shutil.which("docker-compose"), "neither docker compose nor docker-compose"
            merged = merge_compose(load_compose(), load_compose(CPU_OVERRIDE))
            one = self.workdir / "docker-compose.cpu-merged.yml"
            one.write_text(yaml.safe_dump(merged, sort_keys=False))
            files = [one, STACK_OVERRIDE]
            command = ["docker-compose"]
        self.argv = [*command, "--project-directory", str(REPO), "-p", PROJECT]
        for path in files:
            self.argv += ["-f", str(path)]
        if not self.ports:
            names = (
                "REPLAY_PORT",
                "SIDECAR_PORT",
                "MINIO_PORT",
                "MINIO_CONSOLE_PORT",
                "PROMETHEUS_PORT",
            )
            self.ports = {name: free_port() for name in names}

    def environment(self) -> dict[str, str]:
        """This process's environment without what the compose file interpolates."""
        skip = ("RLREPLAY_", "MINIO_", "S3_", "AWS_", "SIDECAR_", "GRAFANA_", "COMPOSE_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
        return env | {name: str(port) for name, port in self.ports.items()}

    def compose(self, *args: str, timeout_s: float = 300, check: bool = True) -> str:
        result = subprocess.run(
            [*self.argv, *args],
            cwd=REPO,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {result.returncode}\n{result.stderr}")
        return result.stdout + result.stderr

    def container(self, service: str) -> str:
        found = self.compose("ps", "-q", service).split()
        assert found, f"no container for {service}"
        return found[-1]

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "-t", "20", timeout_s=180, check=False)

    def report(self) -> str:
        """What a failure prints: the containers and the end of each service's log."""
        return "\n".join(
            [
                self.compose("ps", check=False, timeout_s=60),
                self.compose("logs", "--no-color", "--tail", "60", check=False, timeout_s=60),
            ]
        )


def _docker(*args: str, timeout_s: float = 60) -> str:
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert result.returncode == 0, f"docker {' '.join(args)}: {result.stderr}"
    return result.stdout.strip()


def _state(container: str) -> dict[str, str]:
    form = "{{.State.Status}} {{.RestartCount}} {{if .State.Health}}{{.State.Health.Status}}{{end}}"
    status, restarts, *health = _docker("inspect", "-f", form, container).split()
    return {"status": status, "restarts": restarts, "health": health[0] if health else ""}


def _wait(stack: Stack, what: str, timeout_s: float, done: Callable[[], bool]) -> float:
    """Polls ``done`` until it holds; the seconds it took. Fails with the last error ``done``
    raised and the stack's state."""
    started = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - started < timeout_s:
        try:
            if done():
                return time.monotonic() - started
        except (httpx.HTTPError, ReplayError, AssertionError, OSError) as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})\n{stack.report()}")


def _healthy(stack: Stack, service: str) -> Callable[[], bool]:
    return lambda: _state(stack.container(service))["health"] == "healthy"


def _value(i: int) -> dict[str, object]:
    return {"i": i, "obs": np.full(4, i, dtype=np.float32)}


def _check_values(items: list[dict[str, object] | None], keys: list[str]) -> None:
    missing = [key for key, item in zip(keys, items, strict=True) if item is None]
    assert not missing, f"{len(missing)} answered items are gone: {missing[:5]}"
    for key, item in zip(keys, items, strict=True):
        assert item is not None and item["key"] == key
        value = item["value"]
        assert isinstance(value, dict)
        i = int(key[1:])
        assert value["i"] == i, (key, value)
        assert np.array_equal(value["obs"], np.full(4, i, dtype=np.float32)), (key, value)


async def _push_sample_snapshot(url: str) -> tuple[list[str], str]:
    """Pushes ITEMS items (answered once committed), samples, snapshots: the keys and the
    snapshot's id."""
    keys = [f"k{i}" for i in range(ITEMS)]
    async with ReplayClient(url) as rb:
        for start in range(0, ITEMS, 100):
            batch = [{"key": f"k{i}", "value": _value(i)} for i in range(start, start + 100)]
            assert await rb.push(TABLE, batch, wait=True) == len(batch)
        sampled = await rb.sample(TABLE, 64)
        assert len(sampled) == 64
        for item in sampled:
            assert item["value"]["i"] == int(item["key"][1:])
        snapshot = await rb.snapshot()
        assert snapshot["items"] >= ITEMS, snapshot
        _check_values(await rb.get_many(TABLE, keys), keys)
    return keys, str(snapshot["id"])


async def _get_all(url: str, keys: list[str]) -> list[dict[str, object] | None]:
    async with ReplayClient(url) as rb:
        return list(await rb.get_many(TABLE, keys))


def _all_there(url: str, keys: list[str]) -> bool:
    _check_values(asyncio.run(_get_all(url, keys)), keys)
    return True


def _query(prometheus_url: str, query: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": query}, timeout=10)
    assert answer.status_code == 200, answer.text
    result: list[dict[str, Any]] = answer.json()["data"]["result"]
    return result


def _scraped(prometheus_url: str) -> bool:
    """Both jobs up, the dashboard's item count at ITEMS, the sidecar's lag reported."""
    up = {r["metric"]["job"]: r["value"][1] for r in _query(prometheus_url, "up")}
    assert up == {"rlreplay": "1", "rlreplay-sidecar": "1"}, up
    items = _query(prometheus_url, 'rlreplay_all_tables_items{job="rlreplay"}')
    assert items and float(items[0]["value"][1]) == ITEMS, items
    assert _query(prometheus_url, 'rlreplay_sidecar_lag_events{job="rlreplay-sidecar"}')
    return True


def _sidecar_sample(url: str) -> dict[str, object]:
    answer = httpx.post(
        f"{url}/v1/sample",
        content=msgpack.packb({"batch_size": 32, "strategy": "uniform", "fields": ["i", "obs"]}),
        headers={"Content-Type": "application/msgpack", "Accept": "application/msgpack"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    batch: dict[str, object] = unpackb(answer.content)
    return batch


def _sidecar_serves_the_values(url: str) -> bool:
    batch = _sidecar_sample(url)
    keys = batch["keys"]
    columns = batch["columns"]
    assert isinstance(keys, list) and isinstance(columns, dict) and len(keys) == 32
    expected = np.array([int(key[1:]) for key in keys])
    assert np.array_equal(np.asarray(columns["i"]), expected), (keys, columns["i"])
    obs = np.asarray(columns["obs"])
    assert np.array_equal(obs, np.repeat(expected[:, None], 4, axis=1).astype(np.float32))
    return True


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path)
    stack.down()  # what an earlier run that was killed may have left
    try:
        yield stack
    finally:
        stack.down()
        left = _docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}")
        assert not left, f"containers left behind: {left}"
        print(f"\nstack-test timings: {json.dumps(stack.timings)}")


def test_the_stack_serves_restarts_and_restores_from_object_storage(stack: Stack) -> None:
    started = time.monotonic()
    stack.compose("up", "-d", "--no-build", *SERVICES, timeout_s=START_S)
    stack.timings["compose_up_s"] = round(time.monotonic() - started, 1)
    _wait(stack, "replay healthy", START_S, _healthy(stack, "replay"))
    stack.timings["replay_healthy_s"] = round(time.monotonic() - started, 1)
    _wait(stack, "sidecar healthy", START_S, _healthy(stack, "sidecar"))
    stack.timings["stack_start_s"] = round(time.monotonic() - started, 1)
    replay_url = stack.url("REPLAY_PORT")
    sidecar_url = stack.url("SIDECAR_PORT")
    published = stack.compose("port", "replay", "8000").strip()
    assert published == f"127.0.0.1:{stack.ports['REPLAY_PORT']}", published

    keys, snapshot_id = asyncio.run(_push_sample_snapshot(replay_url))
    _wait(
        stack,
        "the sidecar follows the pushes",
        RESTART_S,
        lambda: _sidecar_serves_the_values(sidecar_url),
    )

    # Prometheus (the compose file's service and configuration) scrapes both.
    prometheus_url = stack.url("PROMETHEUS_PORT")
    _wait(stack, "Prometheus scrapes the items", RESTART_S, lambda: _scraped(prometheus_url))

    # 1. A frozen server: the liveness probe fails three times, the check ends it, and the
    # restart policy starts the container again on its volume.
    replay = stack.container("replay")
    assert _state(replay)["restarts"] == "0"
    _docker("exec", "-u", "0", replay, "sh", "-c", "kill -STOP $(cat /proc/1/task/1/children)")
    stack.timings["unresponsive_to_restarted_s"] = round(
        _wait(
            stack,
            "restart of the frozen server",
            RESTART_S,
            lambda: _state(replay)["restarts"] == "1",
        ),
        1,
    )
    _wait(stack, "replay healthy after its restart", RESTART_S, _healthy(stack, "replay"))
    _wait(stack, "every answered item after the restart", 60, lambda: _all_there(replay_url, keys))

    # 2. The node is lost: SIGKILL, the volume removed, the service started again.
    _docker("kill", "-s", "KILL", replay)
    _wait(stack, "replay killed", 60, lambda: _state(replay)["status"] == "exited")
    stack.compose("rm", "-f", "-s", "replay")
    volume = f"{PROJECT}_replay-data"
    _docker("volume", "rm", volume)
    restore_started = time.monotonic()
    stack.compose("up", "-d", "--no-build", "replay", timeout_s=START_S)
    _wait(stack, "replay restored and healthy", START_S, _healthy(stack, "replay"))
    stack.timings["restore_to_healthy_s"] = round(time.monotonic() - restore_started, 1)
    logs = stack.compose("logs", "--no-color", "replay")
    assert snapshot_id in logs, f"no restore of {snapshot_id} in the log:\n{logs[-3000:]}"
    _wait(stack, "every answered item after the restore", 60, lambda: _all_there(replay_url, keys))

    # 3. The sidecar serves the restored values.
    _wait(
        stack,
        "the sidecar serves the restored values",
        RESTART_S,
        lambda: _sidecar_serves_the_values(sidecar_url),
    )
    print(f"\nimage sizes (MB): {_image_sizes()}")


def _image_sizes() -> dict[str, int]:
    sizes = {}
    for image in (
        "rlreplay:latest",
        "rlreplay-sidecar:latest",
        "rlreplay-moto:test",
        "rlreplay-prometheus:test",
    ):
        sizes[image] = int(_docker("image", "inspect", "-f", "{{.Size}}", image)) // 1_000_000
    return sizes


if __name__ == "__main__":
    if sys.argv[1:] == ["--down"]:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            Stack(Path(folder)).down()
    else:
        sys.exit("usage: python -m tests.deploy.stack_docker --down")
