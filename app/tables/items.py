"""What an item is, on the way in and on the way out of the engine.

The per-item records are :class:`msgspec.Struct` classes without GC tracking (they hold
only strings, bytes and numbers): built per item on every hot path, they cost far less
than a slotted dataclass, whose ``__init__`` is Python code (``python -m bench engine``
measures the paths that build them). Treat them as read-only.
The batch classes stay dataclasses: one per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import msgspec
import numpy as np
import numpy.typing as npt

from rlreplay.app.tables.stacking import Column
from rlreplay.wire.schemas import MAX_KEY_BYTES, PushRequest

__all__ = [
    "MAX_KEY_BYTES",
    "Item",
    "ItemBatch",
    "NewItem",
    "SampleBatch",
    "SampledItem",
    "push_body_items",
]


class NewItem(msgspec.Struct, gc=False):
    """An item as pushed: ``value`` is the msgpack encoding the client sent, kept as is;
    ``group``, ``version`` and ``tags``: its rollout metadata (None: none given)."""

    key: str
    value: bytes
    priority: float = 1.0
    group: str | None = None
    version: int | None = None
    tags: dict[str, Any] | None = None


class PatchedItem(NewItem, gc=False):
    """An existing item whose value a patch merged (a pending entry that is no new item:
    the item keeps its place, metadata and consumption)."""


class Item(msgspec.Struct, gc=False):
    """A stored item as read back."""

    key: str
    value: bytes
    priority: float
    inserted_at: float
    times_sampled: int
    group: str | None = None
    version: int | None = None
    tags: dict[str, Any] | None = None


class SampledItem(msgspec.Struct, gc=False):
    """One pick of a sample: ``probability`` of that pick in one draw, ``weight`` its IS weight."""

    key: str
    value: bytes | None
    priority: float
    probability: float
    weight: float
    times_sampled: int
    group: str | None = None
    version: int | None = None
    tags: dict[str, Any] | None = None


#: Reads the push bodies the write-ahead log keeps as sent (the API accepted them).
_PUSH_BODY = msgspec.msgpack.Decoder(PushRequest)


def push_body_items(body: bytes) -> list[NewItem]:
    """The items of a msgpack push body the API accepted (the log keeps such bodies as sent).

    Raises:
        ValueError: ``body`` is not a msgpack :class:`~rlreplay.wire.schemas.PushRequest`.
    """
    try:
        push = _PUSH_BODY.decode(body)
    except (msgspec.DecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"not a push body of the logged form: {exc}") from exc
    return [
        NewItem(
            it.key,
            bytes(it.value),
            it.priority,
            None if it.group is msgspec.UNSET else it.group,
            None if it.version is msgspec.UNSET else it.version,
            None if it.tags is msgspec.UNSET else it.tags,
        )
        for it in push.items
    ]


@dataclass(slots=True)
class ItemBatch:
    """Items read in one call, as columns; ``values[i]`` is None where the key is missing
    (and the numeric columns hold 0 there)."""

    keys: Sequence[str]
    values: list[bytes | None]
    priorities: npt.NDArray[np.float64]
    inserted_at: npt.NDArray[np.float64]
    times_sampled: npt.NDArray[np.int64]
    #: Each item's group and version (None where it has none), when the table holds any.
    groups: list[str | None] | None = None
    versions: list[int | None] | None = None
    #: Each item's tags (None where it has none), when the table holds any.
    tags: list[dict[str, Any] | None] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def items(self) -> list[Item | None]:
        """The items as :class:`Item` objects, None where missing."""
        nones = [None] * len(self.keys)
        return [
            None if v is None else Item(k, v, p, t, n, g, r, tg)
            for k, v, p, t, n, g, r, tg in zip(
                self.keys,
                self.values,
                self.priorities.tolist(),
                self.inserted_at.tolist(),
                self.times_sampled.tolist(),
                self.groups or nones,
                self.versions or nones,
                self.tags or nones,
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
            [None if it is None else it.group for it in items],
            [None if it is None else it.version for it in items],
            [None if it is None else it.tags for it in items],
        )


@dataclass(slots=True)
class SampleBatch:
    """A sample as columns, the form the HTTP layer encodes without per-item objects.

    ``values[i]`` is None when the sample was taken without values. ``columns``: the values
    stacked by field (:func:`~rlreplay.app.tables.stacking.stack_values`), when the sample
    was asked for in that layout.
    """

    keys: list[str]
    values: list[bytes | None]
    priorities: npt.NDArray[np.float64]
    probabilities: npt.NDArray[np.float64]
    weights: npt.NDArray[np.float64]
    times_sampled: npt.NDArray[np.int64]
    columns: dict[str, Column] | None = None
    #: Each pick's group and version (None where it has none), when the table holds any.
    groups: list[str | None] | None = None
    versions: list[int | None] | None = None
    tags: list[dict[str, Any] | None] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def items(self) -> list[SampledItem]:
        """The picks as :class:`SampledItem` objects."""
        nones = [None] * len(self.keys)
        return list(
            map(
                SampledItem,
                self.keys,
                self.values,
                self.priorities.tolist(),
                self.probabilities.tolist(),
                self.weights.tolist(),
                self.times_sampled.tolist(),
                self.groups or nones,
                self.versions or nones,
                self.tags or nones,
            )
        )


def index_fields_of(value: bytes, names: frozenset[str]) -> dict[str, Any]:
    """The top-level fields ``names`` of a msgpack map value (others and non-maps: absent)."""
    try:
        decoded = msgpack.unpackb(value, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData):
        return {}
    if not isinstance(decoded, dict):
        return {}
    return {name: decoded[name] for name in names if name in decoded}
