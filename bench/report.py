"""Timing and table printing shared by every benchmark section."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def median_rate(fn: Callable[[], int], *, repeats: int = 5, min_time_s: float = 0.0) -> float:
    """Median over ``repeats`` runs of ``fn() / seconds``; ``fn`` returns how many units it did."""
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        units = fn()
        dt = time.perf_counter() - t0
        if dt < min_time_s:
            units2 = units
            while dt < min_time_s:
                units2 += fn()
                dt = time.perf_counter() - t0
            units = units2
        rates.append(units / dt)
    return statistics.median(rates)


def fmt(value: Any) -> str:
    """Numbers in a compact human form: 123.4k, 1.23M, 0.52x, 3.1 ms."""
    if isinstance(value, float):
        if abs(value) >= 1e6:
            return f"{value / 1e6:.2f}M"
        if abs(value) >= 1e4:
            return f"{value / 1e3:.1f}k"
        if abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.3g}"
    return str(value)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A GitHub-markdown table, so the output pastes into docs/benchmarks.md as is."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    print(f"\n### {title}\n", flush=True)
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells:
        print(
            "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |", flush=True
        )
