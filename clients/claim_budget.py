"""Token budgets and ranks of a claim merged from several servers (the sharded client).

Each server of a sharded table answers its own claim, so the budget and the split over
ranks of the merged batch are the client's to apply, by the server's rules (the contract's
"Rollout tables at scale"): items are kept, whole groups at a time, while the lengths of
their ``length_field`` sum within ``max_tokens`` (at least one group), and ranks are a
greedy longest-first split that never splits a group. A field's length is measured as
the server measures it: an array's first axis, the entries of a list or map, a string's
characters, a binary's bytes; a scalar is 1, a missing field or nil 0.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["balance_ranks", "fit_tokens", "item_length", "value_length"]


def value_length(value: Any) -> int:
    """The length of one field's value (see the module docstring)."""
    if value is None:
        return 0
    shape = getattr(value, "shape", None)
    if shape is not None:  # a NumPy array, a torch tensor
        return int(shape[0]) if len(shape) else 1
    if isinstance(value, str | bytes | bytearray | memoryview | list | tuple | Mapping):
        return len(value)
    return 1


def item_length(item: Mapping[str, Any], field: str | None) -> int:
    """The length of ``field`` of a claimed item (from its ``lengths`` with ``values:
    false``); 1 when no field is named, as a rank split counts items."""
    if field is None:
        return 1
    lengths = item.get("lengths")
    if isinstance(lengths, Mapping):
        return int(lengths.get(field, 0))
    value = item.get("value")
    return value_length(value.get(field)) if isinstance(value, Mapping) else 0


def fit_tokens(
    items: Sequence[Mapping[str, Any]],
    field: str,
    room: int,
    tokens: int,
    by_group: bool,
    first: bool,
) -> tuple[list[int], int, bool]:
    """The positions of ``items`` (one server's answer) kept: whole groups (items alone
    without ``by_group``) in the order they first appear, at most ``room`` items, while
    their lengths sum within ``tokens`` (``first``: nothing is held yet, so the first group
    is kept even if longer). Returns them, their tokens, and whether a group was left out
    for the budget (the claim is full)."""
    units: dict[Any, list[int]] = {}
    for i, item in enumerate(items):
        units.setdefault(item.get("group") if by_group else i, []).append(i)
    keep: list[int] = []
    used = 0
    full = False
    for places in units.values():
        size = sum(item_length(items[i], field) for i in places)
        if len(keep) + len(places) > room:
            continue
        if used + size > tokens and not (first and not keep):
            full = True
            break
        keep.extend(places)
        used += size
    return sorted(keep), used, full


def balance_ranks(
    lengths: Sequence[int], groups: Sequence[Any], world_size: int
) -> list[list[int]]:
    """Indices of the items per rank: whole groups (items without a group alone), each
    given, longest first, to the rank whose sum is smallest (the lowest rank on ties);
    each rank's indices ascending."""
    units: dict[Any, list[int]] = {}
    for i, group in enumerate(groups):
        units.setdefault(i if group is None else ("g", group), []).append(i)
    order = sorted(units.values(), key=lambda ix: (-sum(lengths[i] for i in ix), ix[0]))
    heap = [(0, rank) for rank in range(world_size)]
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    for members in order:
        total, rank = heapq.heappop(heap)
        ranks[rank].extend(members)
        heapq.heappush(heap, (total + sum(lengths[i] for i in members), rank))
    return [sorted(members) for members in ranks]
