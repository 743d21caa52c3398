"""The episode examples learn through a live server: the n-step DQN on CartPole and the
recurrent Q-learner with burn-in on CartPole with the velocities hidden each end with a mean
return over their last 20 episodes far above a random policy's (about 22), within a bounded
number of environment steps, with the examples' and the server's seeds fixed.

Both run a short schedule (exploration over a few thousand steps, learning from step 500) so
the pair takes about a minute and a half instead of three: with seed 0 the DQN ends at about
220 after 6,000 steps and the recurrent learner at about 150 after 14,000. Either falls to a
random policy's score when the server's n-step targets are wrong (a terminated episode
bootstrapped as if truncated), so the bars below still catch a broken sampler."""

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
        tmp_path,
        "nstep_dqn/train.py",
        "--env-steps",
        "6000",
        "--epsilon-steps",
        "3000",
        "--learning-starts",
        "500",
        "--seed",
        "0",
        "--log-every",
        "0",
    )
    assert result["random_mean_return"] < 40
    assert result["mean_return_last20"] >= 150, result


def test_the_recurrent_q_learner_learns_cartpole_without_velocities(tmp_path: Path) -> None:
    result = run_example(
        tmp_path,
        "recurrent_q/train.py",
        "--env-steps",
        "14000",
        "--epsilon-steps",
        "5000",
        "--learning-starts",
        "500",
        "--seed",
        "0",
        "--log-every",
        "0",
    )
    assert result["random_mean_return"] < 40
    assert result["mean_return_last20"] >= 100, result
