"""Items' tags and the index that answers ``where`` filters without a scan of the table.

:class:`TagIndex` keeps each slot's tags and, per tag name, value → the slots that carry it
(equality and ``in`` are dict lookups), with the distinct numbers and strings of each name
in sorted lists, so a range (``gte``, ``gt``, ``lte``, ``lt``) is two bisections and the
union of the slot sets between them. A filter's cost follows the items that match it, not
the size of the table.

Values compare as the contract's JSON does: ``1`` and ``1.0`` are equal, ``true`` is not
``1`` (a bool is keyed apart), and a range holds numbers with numeric bounds and strings
with string bounds.

:func:`parse_where` checks a request's ``where`` and gives the :class:`Condition` list that
:meth:`TagIndex.match` and :meth:`TagIndex.matches` take.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rlreplay.wire.errors import ValidationFailed
from rlreplay.wire.rollout_scale import MAX_TAGS

__all__ = ["Condition", "TagIndex", "check_tags", "merge_tags", "parse_where"]

_RANGE_OPS = ("gte", "gt", "lte", "lt")
_SCALARS = (str, int, float, bool)
#: Filters whose matches the index keeps at once (all are dropped past it).
_CACHED_MATCHES = 256


def _keyed(value: Any) -> Any:
    """The dict key of a tag value: a bool apart from the numbers it equals."""
    return ("b", value) if type(value) is bool else value


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def check_tags(tags: Any, where: str) -> dict[str, Any]:
    """A valid tags map: at most 16 names (strings) of strings, ints, floats or bools.

    Raises:
        ValidationFailed: Past 16 tags, a bad name or value.
    """
    if not isinstance(tags, dict):
        raise ValidationFailed(f"{where} must be a map of tag names to values")
    if len(tags) > MAX_TAGS:
        raise ValidationFailed(f"{where} has {len(tags)} tags; the limit is {MAX_TAGS}")
    for name, value in tags.items():
        if not isinstance(name, str) or not 1 <= len(name) <= 128:
            raise ValidationFailed(f"{where}: a tag name must be 1 to 128 characters")
        if type(value) not in _SCALARS:
            raise ValidationFailed(
                f"{where}.{name} must be a string, int, float or bool, not {type(value).__name__}"
            )
        if type(value) is float and not math.isfinite(value):
            raise ValidationFailed(f"{where}.{name} must be finite")
    return tags


@dataclass(frozen=True, slots=True)
class Condition:
    """One tag's condition: equal to one of ``values``, or within the bounds."""

    name: str
    values: tuple[Any, ...] | None = None  # equality or ``in``
    low: Any = None
    low_inclusive: bool = True
    high: Any = None
    high_inclusive: bool = True

    def key(self) -> tuple[Any, ...]:
        """What tells this condition from another (``true`` apart from ``1``)."""
        values = None if self.values is None else tuple(_keyed(v) for v in self.values)
        return (self.name, values, self.low, self.low_inclusive, self.high, self.high_inclusive)

    def holds(self, value: Any) -> bool:
        """Whether a tag value meets this condition (``value`` None: the item lacks it)."""
        if value is None:
            return False
        if self.values is not None:
            key = _keyed(value)
            return any(_keyed(v) == key for v in self.values)
        bound = self.low if self.low is not None else self.high
        if _is_number(bound) != _is_number(value) or type(value) is bool:
            return False
        if self.low is not None and not (
            value >= self.low if self.low_inclusive else value > self.low
        ):
            return False
        return self.high is None or (
            value <= self.high if self.high_inclusive else value < self.high
        )


def parse_where(where: Any) -> list[Condition]:
    """The conditions of a request's ``where`` (see the module docstring).

    Raises:
        ValidationFailed: Not a map, an unknown operator, bounds of mixed kinds.
    """
    if not isinstance(where, dict):
        raise ValidationFailed("where must be a map of tag names to conditions")
    out: list[Condition] = []
    for name, cond in where.items():
        at = f"where.{name}"
        if type(cond) in _SCALARS:
            out.append(Condition(name, (cond,)))
            continue
        if not isinstance(cond, dict) or not cond:
            raise ValidationFailed(f'{at} must be a value, {{"in": [...]}} or a range')
        if "in" in cond:
            values = cond["in"]
            if len(cond) != 1 or not isinstance(values, list):
                raise ValidationFailed(f'{at}: "in" takes a list and stands alone')
            if any(type(v) not in _SCALARS for v in values):
                raise ValidationFailed(f'{at}: "in" lists strings, numbers and bools')
            out.append(Condition(name, tuple(values)))
            continue
        unknown = set(cond) - set(_RANGE_OPS)
        if unknown:
            raise ValidationFailed(f"{at}: unknown operator(s) {sorted(unknown)}")
        bounds = [cond[op] for op in _RANGE_OPS if op in cond]
        if any(type(b) not in (int, float, str) for b in bounds) or (
            len({_is_number(b) for b in bounds}) > 1
        ):
            raise ValidationFailed(f"{at}: range bounds are all numbers or all strings")
        if ("gte" in cond and "gt" in cond) or ("lte" in cond and "lt" in cond):
            raise ValidationFailed(f"{at}: give one lower and one upper bound at most")
        low = cond.get("gte", cond.get("gt"))
        high = cond.get("lte", cond.get("lt"))
        out.append(Condition(name, None, low, "gt" not in cond, high, "lt" not in cond))
    return out


@dataclass(slots=True)
class _Match:
    """A filter's matching slots as of ``stamps``, and (once asked) oldest first."""

    stamps: tuple[int, ...]
    slots: set[int]
    orders: npt.NDArray[np.int64] | None = None
    by_order: npt.NDArray[np.int64] | None = None


class TagIndex:
    """Slot → tags, and per tag name value → slots (see the module docstring)."""

    def __init__(self) -> None:
        self.of: dict[int, dict[str, Any]] = {}
        self._slots: dict[str, dict[Any, set[int]]] = {}
        self._numbers: dict[str, list[Any]] = {}
        self._strings: dict[str, list[str]] = {}
        #: per tag name, a count of the changes to its slots (what a cached match checks)
        self._stamps: dict[str, int] = {}
        self._cache: dict[tuple[Any, ...], _Match] = {}

    def __len__(self) -> int:
        return len(self.of)

    def get(self, slot: int) -> dict[str, Any] | None:
        """The tags of ``slot`` (None: none)."""
        return self.of.get(slot)

    def put(self, slot: int, tags: dict[str, Any] | None) -> None:
        """``slot`` carries ``tags`` now (None or empty: no tags)."""
        if slot in self.of:
            self.remove(slot)
        if not tags:
            return
        self.of[slot] = tags
        stamps = self._stamps
        for name, value in tags.items():
            stamps[name] = stamps.get(name, 0) + 1
            by_value = self._slots.setdefault(name, {})
            key = _keyed(value)
            slots = by_value.get(key)
            if slots is None:
                by_value[key] = {slot}
                self._sorted_list(name, value, insert=True)
            else:
                slots.add(slot)

    def remove(self, slot: int) -> None:
        """``slot`` carries no tags any more."""
        tags = self.of.pop(slot, None)
        if tags is None:
            return
        stamps = self._stamps
        for name, value in tags.items():
            stamps[name] += 1
            by_value = self._slots[name]
            key = _keyed(value)
            slots = by_value[key]
            slots.discard(slot)
            if not slots:
                del by_value[key]
                self._sorted_list(name, value, insert=False)

    def remove_many(self, slots: Iterable[int]) -> None:
        """:meth:`remove` for each of ``slots``."""
        if self.of:
            for slot in slots:
                if slot in self.of:
                    self.remove(slot)

    def _sorted_list(self, name: str, value: Any, *, insert: bool) -> None:
        if type(value) is bool or not isinstance(value, int | float | str):
            return
        if isinstance(value, str):
            values: list[Any] = self._strings.setdefault(name, [])
        else:
            if value != value:  # NaN orders nowhere
                return
            values = self._numbers.setdefault(name, [])
        i = bisect.bisect_left(values, value)
        if insert:
            if i == len(values) or values[i] != value:
                values.insert(i, value)
        elif i < len(values) and values[i] == value:  # 1 and 1.0 are one key, one place
            del values[i]

    def _condition_slots(self, cond: Condition) -> set[int]:
        by_value = self._slots.get(cond.name)
        if not by_value:
            return set()
        if cond.values is not None:
            sets = [by_value.get(_keyed(v)) for v in cond.values]
            found = [s for s in sets if s]
            if len(found) == 1:
                return found[0]
            return set().union(*found)
        bound = cond.low if cond.low is not None else cond.high
        values = (self._numbers if _is_number(bound) else self._strings).get(cond.name, [])
        start, stop = 0, len(values)
        if cond.low is not None:
            find = bisect.bisect_left if cond.low_inclusive else bisect.bisect_right
            start = find(values, cond.low)
        if cond.high is not None:
            find = bisect.bisect_right if cond.high_inclusive else bisect.bisect_left
            stop = find(values, cond.high)
        out: set[int] = set()
        for value in values[start:stop]:
            out |= by_value.get(value) or set()
        return out

    def match(self, conditions: list[Condition]) -> set[int]:
        """The slots whose tags meet every condition (the caller must not change it)."""
        return self._cached(conditions).slots

    def by_order(
        self, conditions: list[Condition], order: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The insertion orders and the slots of :meth:`match`, oldest first (``order``:
        the table's column of insertion orders; a slot's order changes only with a push,
        which puts its tags again)."""
        found = self._cached(conditions)
        if found.orders is None or found.by_order is None:
            slots = np.fromiter(found.slots, dtype=np.int64, count=len(found.slots))
            orders = order[slots]
            oldest = np.argsort(orders, kind="stable")
            found.orders, found.by_order = orders[oldest], slots[oldest]
        return found.orders, found.by_order

    def _cached(self, conditions: list[Condition]) -> _Match:
        """The match of ``conditions``, kept until a slot of one of their tags changes."""
        key = tuple(c.key() for c in conditions)
        stamps = tuple(self._stamps.get(c.name, 0) for c in conditions)
        found = self._cache.get(key)
        if found is not None and found.stamps == stamps:
            return found
        sets = sorted((self._condition_slots(c) for c in conditions), key=len)
        if not sets:
            slots: set[int] = set()
        elif len(sets) == 1:
            slots = sets[0]
        else:
            first, rest = sets[0], sets[1:]
            slots = {slot for slot in first if all(slot in s for s in rest)}
        if len(self._cache) >= _CACHED_MATCHES:
            self._cache.clear()
        found = self._cache[key] = _Match(stamps, slots)
        return found

    def matches(self, tags: dict[str, Any] | None, conditions: list[Condition]) -> bool:
        """Whether ``tags`` meet every condition (an item not yet applied)."""
        tags = tags or {}
        return all(c.holds(tags.get(c.name)) for c in conditions)


def merge_tags(old: dict[str, Any] | None, new: dict[str, Any] | None) -> dict[str, Any] | None:
    """``old`` with the tags of ``new`` set (``old`` itself when ``new`` sets none).

    Raises:
        ValidationFailed: The merged tags pass 16.
    """
    if not new:
        return old
    merged = {**(old or {}), **new}
    if len(merged) > MAX_TAGS:
        raise ValidationFailed(f"an item would carry {len(merged)} tags; the limit is {MAX_TAGS}")
    return merged
