"""Without torch (the ``gpu`` extra), the sidecar's names say which extra to install rather
than failing with a bare ``ModuleNotFoundError``. Each case runs in a fresh interpreter
whose import system refuses ``torch``, as an environment without it would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live import REPO

#: Installed as ``sitecustomize`` on the child's path: torch cannot be imported there.
HIDE_TORCH = """
import importlib.abc
import sys


class HideTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, HideTorch())
"""
INSTALL = "pip install 'rlreplay[gpu]'"
FROM_A_CLONE = "pip install -e '.[gpu]'"


def without_torch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(HIDE_TORCH)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLREPLAY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_child_really_has_no_torch(tmp_path: Path) -> None:
    done = without_torch(tmp_path, "-c", "import torch")
    assert done.returncode == 1 and "No module named 'torch'" in done.stderr, done


@pytest.mark.parametrize(
    "statement",
    [
        "from rlreplay import GpuSampler",
        "import rlreplay; rlreplay.GpuSampler",
        "from rlreplay import ReplayDataset",
        "import rlreplay.gpu.service",
    ],
)
def test_the_gpu_names_say_which_extra_to_install(tmp_path: Path, statement: str) -> None:
    check = f"""
try:
    {statement}
except ImportError as exc:
    assert exc.name == "torch", exc.name
    print(type(exc).__name__, exc, sep=": ")
else:
    raise SystemExit("imported without torch")
"""
    done = without_torch(tmp_path, "-c", check)
    assert done.returncode == 0, done
    assert done.stdout.startswith("TorchMissing: "), done.stdout
    assert INSTALL in done.stdout and FROM_A_CLONE in done.stdout, done.stdout


def test_the_client_needs_no_torch(tmp_path: Path) -> None:
    done = without_torch(tmp_path, "-c", "from rlreplay import ReplayClient, ReplayError")
    assert done.returncode == 0, done


def test_rlreplay_sidecar_says_so_in_one_line(tmp_path: Path) -> None:
    done = without_torch(tmp_path, "-m", "rlreplay", "sidecar", "--help")
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlreplay sidecar: error: "), lines
    assert lines[0].count(INSTALL) == 1, lines
