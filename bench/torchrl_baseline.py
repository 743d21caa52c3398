"""TorchRL's samplers, the baseline of the selection benchmark.

TorchRL's ``PrioritizedSampler`` keeps its segment trees in a C++ extension built against
one torch release: torchrl 0.14 loads with torch 2.14 and not with the torch 2.13 CPU
build the test environment pins. So the rows are measured in whichever interpreter can
load it: this one if it can, else the one named by ``RLREPLAY_TORCHRL_PYTHON`` (``make
bench`` builds ``.venv-torchrl`` with torch 2.14.1 + torchrl 0.14.1 for it), as a
subprocess running this module, on the same machine and in the same run.

This module imports nothing of the project, so that interpreter needs only torch,
torchrl and numpy: ``python -m bench.torchrl_baseline N REPEATS`` prints JSON rows.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 256
ROOT = Path(__file__).resolve().parents[1]


def median_us(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` in microseconds, after two warm-up calls."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - started)
    return statistics.median(times) / 1e3


def _extension_loads() -> bool:
    try:
        import torchrl._torchrl  # noqa: F401
    except ImportError:
        return False
    return True


def measure(n: int, repeats: int, batch: int = BATCH) -> list[list[Any]]:
    """Rows for TorchRL's samplers over a 1-D storage of ``n`` items, in this interpreter."""
    import torch
    import torchrl
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler, SamplerWithoutReplacement
    from torchrl.data.replay_buffers.storages import TensorStorage

    rng = np.random.default_rng(0)
    torch.set_num_threads(1)
    tag = f" (torch {torch.__version__.split('+')[0]}, torchrl {torchrl.__version__})"
    storage = TensorStorage(torch.zeros(n, dtype=torch.uint8))
    prioritized = PrioritizedSampler(n, alpha=0.6, beta=0.4, dtype=torch.float64)
    prioritized.update_priority(torch.arange(n), torch.from_numpy(rng.uniform(0.01, 10.0, n)))
    batches = [
        (
            torch.from_numpy(rng.choice(n, size=BATCH, replace=False)),
            torch.from_numpy(rng.uniform(0.01, 10.0, BATCH)),
        )
        for _ in range(16)
    ]
    step = iter(range(1 << 62))

    def update() -> None:
        index, priority = batches[next(step) % len(batches)]
        prioritized.update_priority(index, priority)

    without = SamplerWithoutReplacement()
    return [
        [
            "torchrl PrioritizedSampler" + tag,
            f"{n:,}",
            median_us(lambda: prioritized.sample(storage, batch), repeats),
            median_us(update, repeats),
            "-",
        ],
        [
            "torchrl SamplerWithoutReplacement" + tag,
            f"{n:,}",
            median_us(lambda: without.sample(storage, batch), repeats),
            "-",
            "-",
        ],
    ]


def torchrl_rows(n: int, repeats: int, batch: int = BATCH) -> list[list[Any]]:
    """TorchRL's rows, measured here or in ``RLREPLAY_TORCHRL_PYTHON``; rows saying why not."""
    try:
        loads_here = _extension_loads()
    except Exception:  # torchrl absent or broken here: try the other interpreter
        loads_here = False
    if loads_here:
        return measure(n, repeats, batch)
    python = os.environ.get("RLREPLAY_TORCHRL_PYTHON") or str(ROOT / ".venv-torchrl/bin/python")
    if not Path(python).exists():
        why = "TorchRL's C++ extension does not load with this torch; run `make bench`"
        return [["torchrl PrioritizedSampler", f"{n:,}", why, "-", "-"]]
    done = subprocess.run(
        [python, "-m", "bench.torchrl_baseline", str(n), str(repeats), str(batch)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return [["torchrl PrioritizedSampler", f"{n:,}", f"failed: {tail[0]}", "-", "-"]]
    rows: list[list[Any]] = json.loads(done.stdout)
    return rows


if __name__ == "__main__":
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else BATCH
    print(json.dumps(measure(int(sys.argv[1]), int(sys.argv[2]), batch)))
