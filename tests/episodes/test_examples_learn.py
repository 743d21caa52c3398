"""The episode examples learn through a live server: the n-step DQN on CartPole and the
recurrent Q-learner with burn-in on CartPole with the velocities hidden each end with a mean
return over their last 20 episodes far above a random policy's (about 22), within a bounded
number of environment steps, with the examples' and the server's seeds fixed."""

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


def run_example(tmp_path: Path, script: str, *flags: str) -> dict[str, Any]:
    """Runs ``examples/<script>`` against a fresh server whose draws are seeded (the example
    makes one call at a time, so the run repeats); its closing JSON line."""
    with running_server(tmp_path, "--seed", "0") as server:
        run = subprocess.run(
            [sys.executable, str(REPO / "examples" / script), "--url", server.url, *flags],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    assert run.returncode == 0, run.stdout + run.stderr
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def test_the_nstep_dqn_learns_cartpole(tmp_path: Path) -> None:
    result = run_example(
        tmp_path, "nstep_dqn/train.py", "--env-steps", "15000", "--seed", "0", "--log-every", "0"
    )
    assert result["random_mean_return"] < 40
    assert result["mean_return_last20"] >= 150, result


def test_the_recurrent_q_learner_learns_cartpole_without_velocities(tmp_path: Path) -> None:
    result = run_example(
        tmp_path,
        "recurrent_q/train.py",
        "--env-steps",
        "30000",
        "--seed",
        "0",
        "--log-every",
        "0",
    )
    assert result["random_mean_return"] < 40
    assert result["mean_return_last20"] >= 100, result
