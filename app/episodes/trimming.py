"""Which whole episodes a full episode table removes: its remover over episodes.

An episode table's ``max_size`` counts steps. Past it, whole episodes go, ended ones first
(then open ones), each chosen by the table's remover, never the episode just appended to.
"""

from __future__ import annotations

import numpy as np

from rlreplay.app.episodes.episode import Episode
from rlreplay.app.episodes.episode_table import EpisodeTable

__all__ = ["take_excess"]


def take_excess(
    e: EpisodeTable,
    max_size: int,
    remover: str,
    rng: np.random.Generator,
    *,
    keep: str | None = None,
) -> list[tuple[str, int]]:
    """Remove whole episodes of ``e`` until at most ``max_size`` steps are held: ended ones
    first, then open ones, each chosen by ``remover`` (``fifo``: oldest first, ``lifo``:
    newest first, ``uniform``: at random, the heaps by their first step's priority), never
    ``keep``. The choice depends on the applied state and on ``rng`` alone (the writer
    seeds it from the log position), so a replay of the log makes the same. Returns the
    episodes removed: (name, steps) each."""
    removed: list[tuple[str, int]] = []
    priority = e.priority

    def first_priority(ep: Episode) -> float:
        return float(priority[ep.slots[0]]) if ep.length else 0.0

    while e.steps > max_size:
        held = [ep for ep in e.episodes_held() if ep.name != keep]  # oldest first
        candidates = [ep for ep in held if ep.end is not None] or held
        if not candidates:
            break
        if remover == "lifo":
            victim = candidates[-1]
        elif remover == "uniform":
            victim = candidates[int(rng.integers(len(candidates)))]
        elif remover in ("min_heap", "max_heap"):
            sign = 1.0 if remover == "min_heap" else -1.0
            victim = min(candidates, key=lambda ep: sign * first_priority(ep))
        else:
            victim = candidates[0]
        e.delete(victim.name, accepted=False)
        removed.append((victim.name, victim.length))
        priority = e.priority  # a view of the columns as they are now
    return removed
