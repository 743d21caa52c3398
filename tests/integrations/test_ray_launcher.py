"""Replay servers as Ray actors on a local three-node cluster: placement, a client by name in
a remote task, a SIGKILLed server actor restarted by Ray with every answered write, the
final snapshots of ``shutdown``, and a clear refusal when the cluster lacks the resources."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integrations.conftest import REPLAY
from tests.live import REPO

ray = pytest.importorskip("ray")
rlreplay_ray = pytest.importorskip("rlreplay.ray")

pytestmark = pytest.mark.slow

TABLE = "t"


def _wait(condition: Any, what: str, timeout_s: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@ray.remote(num_cpus=0)
def push_and_sample(name: str, start: int, count: int) -> dict[str, Any]:
    """In a worker: a client found by name pushes ``count`` items and samples."""
    import rlreplay.ray

    with rlreplay.ray.client(name) as rb:
        keys = [f"k{i}" for i in range(start, start + count)]
        rb.push_columns(TABLE, keys, {"obs": np.arange(start, start + count, dtype=np.float32)})
        batch = rb.sample(TABLE, 16, layout="columns")
        return {"keys": keys, "sampled": list(batch.keys), "size": len(batch)}


@ray.remote(num_cpus=0)
def with_passed_client(rb: Any) -> int:
    """In a worker: a client handed over pickled reconnects there."""
    return int(rb.describe_table(TABLE)["stats"]["size"])


def test_three_servers_on_three_nodes_survive_a_sigkill(ray_cluster: Any, tmp_path: Path) -> None:
    backups = tmp_path / "backups"
    infos = rlreplay_ray.start(
        "rb",
        resource=REPLAY,
        num_cpus=0.5,
        memory_mb=256,
        data_root=str(tmp_path / "data"),
        backup_url=backups.as_uri(),
        serve_flags=["--no-default-table", "--backup-interval-s", "0"],
        ready_timeout_s=180,
    )
    try:
        # each landed on its own node carrying the resource, bound to the node's address
        replay_nodes = {n["NodeID"] for n in ray.nodes() if n["Resources"].get(REPLAY)}
        assert len(infos) == 3
        assert {i["node_id"] for i in infos} == replay_nodes
        assert all(i["url"].startswith("http://127.0.0.1:") for i in infos)

        rb = rlreplay_ray.client("rb")
        rb.create_table(TABLE, sampler={"type": "uniform"})
        answered = ray.get(push_and_sample.remote("rb", 0, 300), timeout=180)
        assert answered["size"] == 16 and set(answered["sampled"]) <= set(answered["keys"])
        assert ray.get(with_passed_client.remote(rb), timeout=180) == 300

        victim = infos[1]
        os.kill(victim["actor_pid"], signal.SIGKILL)
        back = _restarted(victim)
        assert back["restarted"] and back["node_id"] == victim["node_id"]
        assert back["data_dir"] == victim["data_dir"]
        # the registry holds the restarted server's address
        registry = rlreplay_ray.find_registry("rb")
        assert ray.get(registry.placement.remote(), timeout=60)["starts"] == [1, 2, 1]
        assert rlreplay_ray.shards("rb")["urls"][1] == back["url"]
        # a server process that dies takes its actor with it, and Ray restarts both
        os.kill(infos[2]["server_pid"], signal.SIGKILL)
        assert _restarted(infos[2])["node_id"] == infos[2]["node_id"]
        assert ray.get(registry.placement.remote(), timeout=60)["starts"] == [1, 2, 2]
        rb.close()
        # every write that was answered is back, through a client found by name again
        with rlreplay_ray.client("rb") as again:
            found = again.get_many(TABLE, answered["keys"], layout="columns")
            assert found.missing == [] and len(found) == 300
            assert sorted(found["obs"].tolist()) == list(range(300))
    finally:
        stopped = rlreplay_ray.shutdown("rb")
    assert [s.get("clean") for s in stopped] == [True, True, True], stopped
    assert all(s["snapshot"] for s in stopped)
    assert sorted(p.name for p in backups.iterdir()) == ["rb-0", "rb-1", "rb-2"]
    with pytest.raises(ValueError, match="no replay deployment"):
        rlreplay_ray.client("rb")


def _restarted(before: dict[str, Any]) -> dict[str, Any]:
    """Server ``before["name"]``'s info once an actor process other than ``before``'s runs it."""
    return _wait(  # type: ignore[no-any-return]
        lambda: next(
            (
                i
                for i in _infos()
                if i["name"] == before["name"] and i["actor_pid"] != before["actor_pid"]
            ),
            None,
        ),
        f"Ray to restart server actor {before['name']}",
    )


def _infos() -> list[dict[str, Any]]:
    try:
        return rlreplay_ray.servers("rb")
    except ray.exceptions.RayError:
        return []


@pytest.mark.parametrize(
    "ask",
    [
        {"resource": "gpu_node"},  # no node carries it
        {"n": 4, "resource": REPLAY},  # three do
        {"resource": REPLAY, "num_cpus": 4},  # none has 4 CPUs
    ],
    ids=["no-node-has-it", "too-few-nodes", "too-little-cpu"],
)
def test_a_cluster_without_the_resources_is_refused_at_once(
    ray_cluster: Any, tmp_path: Path, ask: dict[str, Any]
) -> None:
    outcome: list[BaseException] = []

    def start() -> None:
        try:
            rlreplay_ray.start("short", data_root=str(tmp_path), **ask)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    thread.join(30)  # a bound on a hang, not a measured duration
    assert not thread.is_alive(), "start() hung instead of refusing"
    assert len(outcome) == 1 and isinstance(outcome[0], rlreplay_ray.NotEnoughResources)
    assert "replay servers" in str(outcome[0])
    with pytest.raises(ValueError, match="no replay deployment"):
        rlreplay_ray.find_registry("short")


def test_a_client_by_name_outside_ray_says_to_connect_first() -> None:
    # in a process of its own: this one is connected to the module's cluster
    code = "import rlreplay.ray; rlreplay.ray.client('rb')"
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert run.returncode == 1
    assert "connect to its Ray cluster first" in run.stderr.splitlines()[-1]
    assert "Started a local Ray instance" not in run.stderr
