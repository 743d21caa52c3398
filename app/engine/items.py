"""What an item is, on the way in and on the way out of the engine.

Plain slotted dataclasses, not frozen: a frozen one costs four times as much to build,
and these are built per item on every hot path. Treat them as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

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


@dataclass(slots=True)
class SampleBatch:
    """A sample as columns, the form the HTTP layer encodes without per-item objects.

    ``values[i]`` is None when the sample was taken without values.
    """

    keys: list[str]
    values: list[bytes | None]
    priorities: npt.NDArray[np.float64]
    probabilities: npt.NDArray[np.float64]
    weights: npt.NDArray[np.float64]
    times_sampled: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.keys)

    def items(self) -> list[SampledItem]:
        """The picks as :class:`SampledItem` objects."""
        return list(
            map(
                SampledItem,
                self.keys,
                self.values,
                self.priorities.tolist(),
                self.probabilities.tolist(),
                self.weights.tolist(),
                self.times_sampled.tolist(),
            )
        )
