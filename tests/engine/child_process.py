"""Runs a test's child process (a module of this repository) and reads the JSON line it
ends with: memory is measured in a process of its own, not in pytest's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_child(module: str, *args: str) -> dict[str, Any]:
    """Run ``python -m module args...`` from the repository's root; its last line of output,
    as JSON."""
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result
