"""``rlreplay export`` of an episode table: one row per step.

Columns: ``episode``, ``step`` (its number in its episode), ``priority`` (of the window
starting at the step), ``times_sampled`` (windows drawn from there), ``end`` (on an
episode's last step once it ended: ``terminated`` or ``truncated``; empty otherwise), then
one column per step field, as items' fields are written (a field named like one of those
columns becomes ``steps.<field>``). Episodes come oldest first, their steps in order, in
batches bounded in steps and bytes, so memory holds a batch, not the table. ``final``
values are not exported.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from rlreplay.app.episodes.episode_table import EpisodeTable

__all__ = ["STEP_COLUMNS", "step_rows"]

#: A step's own columns, before its fields'.
STEP_COLUMNS = ("episode", "step", "priority", "times_sampled", "end")


def step_rows(
    e: EpisodeTable, *, batch_rows: int, batch_bytes: int
) -> Iterator[list[dict[str, Any]]]:
    """The table's steps as rows (see the module docstring), in batches of at most
    ``batch_rows`` rows and about ``batch_bytes`` bytes of fields."""
    specs = e.specs or {}
    step_bytes = max(1, sum(spec.step_bytes for spec in specs.values()))
    per_batch = max(1, min(batch_rows, batch_bytes // step_bytes))
    names = {f: f"steps.{f}" if f in STEP_COLUMNS else f for f in specs}
    priority, times_sampled = e.priority, e.times_sampled
    rows: list[dict[str, Any]] = []
    for ep in e.episodes_held():
        for lo in range(0, ep.length, per_batch):
            hi = min(ep.length, lo + per_batch)
            values = e.read(ep.name, lo, hi)
            slots = ep.slots[lo:hi]
            prios, sampled = priority[slots].tolist(), times_sampled[slots].tolist()
            for i in range(hi - lo):
                step = lo + i
                row: dict[str, Any] = {
                    "episode": ep.name,
                    "step": step,
                    "priority": prios[i],
                    "times_sampled": sampled[i],
                    "end": ep.end if ep.end is not None and step == ep.length - 1 else None,
                }
                for f, column in names.items():
                    row[column] = _cell(values[f][i])
                rows.append(row)
            if len(rows) >= per_batch:
                yield rows
                rows = []
    if rows:
        yield rows


def _cell(value: np.ndarray) -> Any:
    """A step's value of a field: a scalar for a field of shape ``()``, else its array."""
    return value.item() if value.ndim == 0 else np.array(value)
