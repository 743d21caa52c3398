"""What an item is, on the way in and on the way out of the engine."""

from __future__ import annotations

from dataclasses import dataclass

MAX_KEY_BYTES = 512


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item as pushed: ``value`` is the msgpack encoding the client sent, kept as is."""

    key: str
    value: bytes
    priority: float = 1.0


@dataclass(frozen=True, slots=True)
class Item:
    """A stored item as read back."""

    key: str
    value: bytes
    priority: float
    inserted_at: float
    times_sampled: int


@dataclass(frozen=True, slots=True)
class SampledItem:
    """One pick of a sample: ``probability`` of that pick in one draw, ``weight`` its IS weight."""

    key: str
    value: bytes | None
    priority: float
    probability: float
    weight: float
    times_sampled: int
