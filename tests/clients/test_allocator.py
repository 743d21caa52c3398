"""The glibc thresholds stop the fault-in of freed buffers on every request (Linux/glibc)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlreplay.wire.allocator import glibc

# The child imports nothing heavy before it measures: imports that free big buffers move
# glibc's dynamic thresholds, which would hide the default behaviour.
CHILD = """
import os
import sys

def faults():
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])

if sys.argv[1] == "tuned":
    from rlreplay.wire.allocator import raise_malloc_thresholds
    assert raise_malloc_thresholds()
bodies = [os.urandom(256 * 1024) for _ in range(16)]  # request bodies
def rounds(n):
    for r in range(n):  # a request's 64 values of 4 KiB, freed when the next arrive
        values = [bodies[r % 16][i * 4096 : (i + 1) * 4096] for i in range(64)]
rounds(50)
start = faults()
rounds(500)
print((faults() - start) / 500)
"""


def _faults_per_round(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    return float(out.stdout.strip())


@pytest.mark.skipif(glibc() is None, reason="the thresholds are glibc's")
def test_raised_thresholds_keep_freed_buffers_mapped() -> None:
    tuned = _faults_per_round("tuned")
    default = _faults_per_round("default")
    print(f"page faults per round of 64 x 4 KiB: default {default:.1f}, tuned {tuned:.1f}")
    assert tuned < 1.0
    # Where the default thresholds trim the freed values, the fixed ones must do better.
    assert default == 0.0 or tuned < default / 10
