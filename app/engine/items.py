"""What an item is, on the way in and on the way out of the engine.

Plain slotted dataclasses, not frozen: a frozen one costs four times as much to build,
and these are built per item on every hot path. Treat them as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_KEY_BYTES = 512


@dataclass(slots=True)
class NewItem:
    """An item as pushed: ``value`` is the msgpack encoding the client sent, kept as is."""

    key: str
    value: bytes
    priority: float = 1.0


@dataclass(slots=True)
class Item:
    """A stored item as read back."""

    key: str
    value: bytes
    priority: float
    inserted_at: float
    times_sampled: int


@dataclass(slots=True)
class SampledItem:
    """One pick of a sample: ``probability`` of that pick in one draw, ``weight`` its IS weight."""

    key: str
    value: bytes | None
    priority: float
    probability: float
    weight: float
    times_sampled: int
