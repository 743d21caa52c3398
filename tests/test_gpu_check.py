"""``make gpu-check`` on a machine without a CUDA device: one line that says so, exit 0."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check

ROOT = Path(__file__).resolve().parents[1]


def test_the_make_target_runs_the_check() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^gpu-check:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe is not None
    assert "-m bench.gpu_check" in recipe.group(1)


def test_without_a_cuda_device_it_says_so_and_exits_0() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: make gpu-check measures it")
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no CUDA device found")


def test_without_torch_it_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert gpu_check.main([]) == 0
    assert (
        capsys.readouterr().out
        == "gpu-check: no CUDA device found (torch is not installed); nothing to measure\n"
    )


def test_the_steps_fit_in_8_minutes() -> None:
    assert sum(limit for _, _, limit in gpu_check.STEPS) + 90 < 8 * 60  # + the copies
