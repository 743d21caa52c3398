"""The Gymnasium collector and the Ray example run as written, bounded in steps and time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.live import REPO, running_server

pytestmark = pytest.mark.slow


def run_script(script: str, *flags: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs ``examples/<script>`` from the repository's root; its closing JSON line."""
    run = subprocess.run(
        [sys.executable, str(REPO / "examples" / script), *flags],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def test_the_gym_collector_fills_an_episode_table_while_a_learner_samples(
    tmp_path: Path,
) -> None:
    pytest.importorskip("gymnasium")
    with running_server(tmp_path, "--no-default-table") as server:
        result = run_script(
            "gym_collector/collect.py",
            *("--url", server.url, "--envs", "4", "--env-steps", "300", "--log-every", "0"),
            *("--keep-table",),
        )
        import rlreplay

        with rlreplay.Client(server.url) as rb:
            stored = rb.describe_table("gym_episodes")["stats"]["size"]
    assert result["env_steps"] == 1200 and result["episodes"] > 0
    # every step of an ended episode, and those of the running ones appended so far
    assert 0 < result["table_size"] == stored <= 1200
    assert result["learner_updates"] > 0


def test_the_ray_example_pushes_from_tasks_and_samples_from_an_actor() -> None:
    pytest.importorskip("ray")
    result = run_script(
        "ray_replay/run.py",
        *("--collectors", "2", "--items", "300", "--steps", "10", "--batch-size", "32"),
        # Ray binds loopback, as on a laptop it does not: every server a test starts does
        env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
    )
    assert result["pushed"] == result["table_size"] == 600
    assert result["batches"] == 10 and result["distinct_items_seen"] > 32
    assert [s["url"].split(":")[1] for s in result["servers"]] == ["//127.0.0.1"]
    assert result["stopped_cleanly"] is True
