"""Benchmark of the selectors: time per sample and per priority update, and index memory.

Run as ``python -m bench.selection [--quick]``. For 10^4, 10^6 and 10^7 items (``--quick``
stops at 10^6) it fills each built-in selector, then reports the median time of
``sample(256)`` and of ``update`` of 256 distinct slots, and the bytes of selection
index per item. TorchRL's ``PrioritizedSampler`` and ``SamplerWithoutReplacement`` are
measured in the same run on the same sizes (see :mod:`bench.torchrl_baseline` for the
interpreter they run in); when TorchRL cannot be loaded at all, their rows say why.
"""

from __future__ import annotations

import argparse
import gc
from typing import Any

import numpy as np

from bench.report import print_table
from bench.torchrl_baseline import median_us, torchrl_rows
from rlreplay.app.selection.base import Selector
from rlreplay.app.selection.registry import BUILTIN, make_selector

BATCH = 256
HEADERS = ["sampler", "items", "sample 256 (µs)", "update 256 (µs)", "index B/item"]
PARAMS: dict[str, dict[str, Any]] = {"prioritized": {"exponent": 0.6, "is_exponent": 0.4}}


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
        rows += torchrl_rows(n, args.repeats)
        gc.collect()
        print_table(f"Selection, {n:,} items (median of {args.repeats} calls)", HEADERS, rows)


if __name__ == "__main__":
    main()
