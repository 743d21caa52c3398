"""Benchmark of the selectors: time per sample and per priority update, and index memory.

Run as ``python -m bench.selection [--quick]``. For 10^4, 10^6 and 10^7 items (``--quick``
stops at 10^6) it fills each built-in selector, then reports the median time of
``sample(256)`` and of ``update`` of 256 distinct slots, and the bytes of selection
index per item. TorchRL's ``PrioritizedSampler`` and ``SamplerWithoutReplacement`` are
measured in the same run on the same sizes; when TorchRL (or its C++ extension, which
its prioritized sampler needs) does not load, their rows say why instead.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from app.selection.base import Selector
from app.selection.registry import BUILTIN, make_selector
from bench.report import print_table

BATCH = 256
HEADERS = ["sampler", "items", "sample 256 (µs)", "update 256 (µs)", "index B/item"]
PARAMS: dict[str, dict[str, Any]] = {"prioritized": {"exponent": 0.6, "is_exponent": 0.4}}


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


def fill(selector: Selector, n: int, rng: np.random.Generator) -> None:
    """Inserts ``n`` items with random priorities, inserted over the last hour."""
    chunk = 1_000_000
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        slots = np.arange(start, stop, dtype=np.int64)
        selector.insert(
            slots, rng.uniform(0.01, 10.0, stop - start), 1.7e9 - 3600.0 + 3600.0 * slots / n
        )


def selector_row(name: str, n: int, repeats: int, rng: np.random.Generator) -> list[Any]:
    selector = make_selector(name, dict(PARAMS.get(name, {})))
    fill(selector, n, rng)
    batches = [
        (rng.choice(n, size=BATCH, replace=False).astype(np.int64), rng.uniform(0.01, 10.0, BATCH))
        for _ in range(16)
    ]
    step = iter(range(1 << 62))

    def update() -> None:
        slots, priorities = batches[next(step) % len(batches)]
        selector.update(slots, priorities)

    sample_us = median_us(lambda: selector.sample(BATCH, rng), repeats)
    update_us = median_us(update, repeats)
    return [name, f"{n:,}", sample_us, update_us, selector.index_bytes() / n]


def torchrl_rows(n: int, repeats: int, rng: np.random.Generator) -> list[list[Any]]:
    """TorchRL's samplers over a 1-D storage of ``n`` items, or rows saying why not."""
    try:
        import torch
        from torchrl.data.replay_buffers.samplers import (
            PrioritizedSampler,
            SamplerWithoutReplacement,
        )
        from torchrl.data.replay_buffers.storages import TensorStorage
    except ImportError as exc:
        return [["torchrl", f"{n:,}", f"not installed ({exc})", "-", "-"]]
    torch.set_num_threads(1)
    storage = TensorStorage(torch.zeros(n, dtype=torch.uint8))
    rows: list[list[Any]] = []
    try:
        prioritized = PrioritizedSampler(n, alpha=0.6, beta=0.4, dtype=torch.float64)
    except RuntimeError:
        # Its segment trees live in TorchRL's C++ extension, built for one torch version.
        rows.append(["torchrl PrioritizedSampler", f"{n:,}", "extension not loaded", "-", "-"])
    else:
        everything = torch.arange(n)
        prioritized.update_priority(everything, torch.from_numpy(rng.uniform(0.01, 10.0, n)))
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

        rows.append(
            [
                "torchrl PrioritizedSampler",
                f"{n:,}",
                median_us(lambda: prioritized.sample(storage, BATCH), repeats),
                median_us(update, repeats),
                "-",
            ]
        )
    without = SamplerWithoutReplacement()
    rows.append(
        [
            "torchrl SamplerWithoutReplacement",
            f"{n:,}",
            median_us(lambda: without.sample(storage, BATCH), repeats),
            "-",
            "-",
        ]
    )
    return rows


def main(argv: list[str] | None = None) -> None:
    """Prints one table per size; ``--quick`` skips 10^7 items."""
    parser = argparse.ArgumentParser(prog="python -m bench.selection", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="stop at 10^6 items")
    parser.add_argument("--repeats", type=int, default=201, help="timed calls per median")
    args = parser.parse_args(argv)
    sizes = [10_000, 1_000_000] + ([] if args.quick else [10_000_000])
    rng = np.random.default_rng(0)
    for n in sizes:
        rows = []
        for name in BUILTIN:
            rows.append(selector_row(name, n, args.repeats, rng))
            gc.collect()  # each selector's index is garbage once its row is measured
        rows += torchrl_rows(n, args.repeats, rng)
        gc.collect()
        print_table(f"Selection, {n:,} items (median of {args.repeats} calls)", HEADERS, rows)


if __name__ == "__main__":
    main()
