"""What an item is, on the way in and on the way out of the engine.

The per-item records are :class:`msgspec.Struct` classes without GC tracking (they hold
only strings, bytes and numbers): built per item on every hot path, they cost about a
fifth of a slotted dataclass, whose ``__init__`` is Python code. Treat them as read-only.
The batch classes stay dataclasses: one per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

MAX_KEY_BYTES = 512


class NewItem(msgspec.Struct, gc=False):
    """An item as pushed: ``value`` is the msgpack encoding the client sent, kept as is."""

    key: str
    value: bytes
    priority: float = 1.0


class Item(msgspec.Struct, gc=False):
    """A stored item as read back."""

    key: str
    value: bytes
    priority: float
    inserted_at: float
    times_sampled: int


class SampledItem(msgspec.Struct, gc=False):
    """One pick of a sample: ``probability`` of that pick in one draw, ``weight`` its IS weight."""

    key: str
    value: bytes | None
    priority: float
    probability: float
    weight: float
    times_sampled: int


class PushedItem(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """An item of a msgpack push body, its ``value`` the raw msgpack bytes sent."""

    key: str
    value: msgspec.Raw
    priority: float = 1.0


class _PushBody(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    items: list[PushedItem]
    wait: bool = False


class _PushBodyWait(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    items: list[PushedItem]
    wait: bool


# By the map header of the body: a one-field map that decodes as _PushBody is exactly
# {"items"}, a two-field one that decodes as _PushBodyWait exactly {"items", "wait"}
# (msgspec lets a repeated field overwrite; the API's field walk refuses it, so no other
# size is taken).
_PUSH_DECODERS: dict[int, msgspec.msgpack.Decoder[Any]] = {
    0x81: msgspec.msgpack.Decoder(_PushBody),
    0x82: msgspec.msgpack.Decoder(_PushBodyWait),
}


def decode_push_body(body: bytes) -> tuple[list[PushedItem], bool] | None:
    """The items and ``wait`` of a msgpack push body of the common form (``{"items"}`` or
    ``{"items", "wait"}``, each item ``{"key", "value", "priority"?}``), or None. Nothing
    else is checked here: the API checks keys and priorities before it accepts a body."""
    decoder = _PUSH_DECODERS.get(body[0]) if body else None
    if decoder is None:
        return None
    try:
        decoded = decoder.decode(body)
    except Exception:  # any refusal (msgspec's errors, bad UTF-8...)
        return None
    return decoded.items, decoded.wait


def push_body_items(body: bytes) -> list[NewItem]:
    """The items of a push body the API accepted (the log keeps such bodies as sent).

    Raises:
        ValueError: ``body`` is not of the form :func:`decode_push_body` reads.
    """
    decoded = decode_push_body(body)
    if decoded is None:
        raise ValueError("not a push body of the logged form")
    return [NewItem(it.key, bytes(it.value), it.priority) for it in decoded[0]]


@dataclass(slots=True)
class ItemBatch:
    """Items read in one call, as columns; ``values[i]`` is None where the key is missing
    (and the numeric columns hold 0 there)."""

    keys: Sequence[str]
    values: list[bytes | None]
    priorities: npt.NDArray[np.float64]
    inserted_at: npt.NDArray[np.float64]
    times_sampled: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.keys)

    def items(self) -> list[Item | None]:
        """The items as :class:`Item` objects, None where missing."""
        return [
            None if v is None else Item(k, v, p, t, n)
            for k, v, p, t, n in zip(
                self.keys,
                self.values,
                self.priorities.tolist(),
                self.inserted_at.tolist(),
                self.times_sampled.tolist(),
                strict=True,
            )
        ]

    @classmethod
    def of(cls, keys: Sequence[str], items: list[Item | None]) -> ItemBatch:
        """Columns of ``items`` (None where missing) asked for as ``keys``."""
        return cls(
            keys,
            [None if it is None else it.value for it in items],
            np.array([0.0 if it is None else it.priority for it in items], dtype=np.float64),
            np.array([0.0 if it is None else it.inserted_at for it in items], dtype=np.float64),
            np.array([0 if it is None else it.times_sampled for it in items], dtype=np.int64),
        )


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
