"""An episode of an episode table, and the constants its columns use.

See :mod:`rlreplay.app.episodes.episode_table` for the table that holds episodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlreplay.app.episodes.episode_steps import EpisodeSteps

__all__ = [
    "END_KINDS",
    "OPEN",
    "TERMINATED",
    "TRUNCATED",
    "Episode",
    "chunk_steps_for",
    "end_name",
    "grown",
]

OPEN, TERMINATED, TRUNCATED = 0, 1, 2
#: An end's reason → its ``end_kind``.
END_KINDS = {"terminated": TERMINATED, "truncated": TRUNCATED}
_END_NAMES = {TERMINATED: "terminated", TRUNCATED: "truncated"}

#: A chunk holds about this many bytes of a step's fields (its length a power of two).
CHUNK_TARGET_BYTES = 256 * 2**10
MIN_CHUNK_STEPS, MAX_CHUNK_STEPS = 8, 256


def chunk_steps_for(step_bytes: int) -> int:
    """The chunk length for steps of ``step_bytes`` bytes: a power of two of steps that
    holds about :data:`CHUNK_TARGET_BYTES`, within 8 and 256."""
    steps = max(1, CHUNK_TARGET_BYTES // max(1, step_bytes))
    return int(min(MAX_CHUNK_STEPS, max(MIN_CHUNK_STEPS, 1 << (steps.bit_length() - 1))))


@dataclass(slots=True, eq=False)
class Episode:
    """One episode: its name, index, steps, slots, and how it ended."""

    name: str
    index: int
    steps: EpisodeSteps
    #: Step number → slot (the first ``length`` entries are valid).
    slots: np.ndarray
    #: When it was created, in the table's order (oldest first out of a full table).
    created: int
    end: str | None = None
    final: dict[str, np.ndarray] | None = None
    #: Bytes of ``final``.
    final_bytes: int = field(default=0)
    #: Sealed chunks per field RocksDB holds (-1: not even its record).
    persisted: int = field(default=-1)

    @property
    def length(self) -> int:
        return self.steps.length


def end_name(kind: int) -> str | None:
    """The end's reason of an ``end_kind`` (None: open)."""
    return _END_NAMES.get(kind)


def grown(array: np.ndarray, cap: int) -> np.ndarray:
    out = np.zeros(cap, dtype=array.dtype)
    out[: len(array)] = array
    return out
