"""The GRPO pipeline example runs end to end: four task processes against one server, a
trainer killed mid-lease and restarted, every rollout trained on once (or dropped stale)."""

from __future__ import annotations

import subprocess
import sys

from tests.live import REPO


def test_the_grpo_pipeline_example_runs_end_to_end() -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples/grpo_pipeline/run.py"),
            "--prompts",
            "6",
            "--timeout-s",
            "90",
        ],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[-1] == "OK"
    assert lines[0].startswith("trainer killed holding 16 rollouts")
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:6]}
    assert rows["reference"] == ["48", "6", "True"]
    assert rows["reward"] == ["48", "6", "True"]
    # reservations pace the generator: no group is lost or dropped as stale
    assert "groups: 6 generated, 6 trained, 0 dropped stale, 0 lost" in lines
