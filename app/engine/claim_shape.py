"""What shapes a claim beyond its count: ``where``, ``select``, ``values``, ``max_tokens``
with ``length_field``, and ``world_size`` (the contract's "Rollout tables at scale").

:class:`ClaimShape` holds them, checked; :func:`lengths_of` measures the length field of
picked items for a token budget, from the cache of lengths the table's rollout index keeps
(:attr:`Rollouts.lengths`), reading values from disk only for those it lacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlreplay.app.tables.tag_index import Condition, parse_where
from rlreplay.app.tables.token_budget import field_length
from rlreplay.wire.errors import ValidationFailed

if TYPE_CHECKING:
    from rlreplay.app.engine.reads import Reads
    from rlreplay.app.tables.table import Table

__all__ = ["ClaimShape", "lengths_of"]


@dataclass(frozen=True, slots=True)
class ClaimShape:
    """A claim's filters and budgets (all optional)."""

    where: list[Condition] | None = None
    select: list[str] | None = None
    values: bool = True
    max_tokens: int | None = None
    length_field: str | None = None
    world_size: int | None = None

    @classmethod
    def of(
        cls,
        *,
        where: Any = None,
        select: list[str] | None = None,
        values: bool = True,
        max_tokens: int | None = None,
        length_field: str | None = None,
        world_size: int | None = None,
    ) -> ClaimShape:
        """A checked shape.

        Raises:
            ValidationFailed: ``max_tokens`` without ``length_field``, a bad ``where``.
        """
        if max_tokens is not None and length_field is None:
            raise ValidationFailed('max_tokens needs "length_field": the field it counts')
        return cls(
            (parse_where(where) or None) if where is not None else None,  # {}: every item
            select,
            values,
            max_tokens,
            length_field,
            world_size,
        )

    def returned(self, fields: list[str] | None) -> list[str] | None:
        """The fields the items' values hold (None: the whole value)."""
        return self.select if self.select is not None else fields


async def lengths_of(reads: Reads, t: Table, slots: list[int], name: str) -> tuple[list[int], bool]:
    """The length of field ``name`` of the items at ``slots`` (0 where an item lacks it),
    and whether some were read from disk (the caller awaited: the table may have moved)."""
    cache = t.rollouts.lengths
    out: list[int | None] = []
    misses: list[tuple[int, int, str]] = []
    for i, slot in enumerate(slots):
        known = cache.get(slot)
        if known is not None and name in known:
            out.append(known[name])
            continue
        value = t.values[slot]
        if value is None:
            key = t.keys[slot]
            if key is not None:
                misses.append((i, slot, key))
            out.append(None)
            continue
        n = field_length(value, name)
        cache.setdefault(slot, {})[name] = n
        out.append(n)
    if misses:
        found: list[Any] = [None] * len(slots)
        await reads.read_misses(t, misses, found)
        for i, slot, key in misses:
            item = found[i]
            n = 0 if item is None else field_length(item.value, name)
            if item is not None and t.keys[slot] == key:
                cache.setdefault(slot, {})[name] = n
            out[i] = n
    return [0 if n is None else n for n in out], bool(misses)
