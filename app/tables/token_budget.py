"""Token budgets and rank-balanced splits of a claim (the contract's "Token budgets" and
"Ranks").

A field's *length* is what a trainer counts as tokens: the first axis of an array (msgpack
extension type 1), the entries of a list or a map, the characters of a string, the bytes
of a binary; a scalar is 1 and a missing field or nil 0. :func:`field_length` reads it
from an item's stored value, looking at no more of it than it must.

:func:`fit_budget` cuts a claim's picked items (oldest first, whole groups) to a budget,
:func:`balance_ranks` splits claimed items across data-parallel ranks, greedy longest
first, never splitting a group.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Sequence
from typing import Any

import msgspec

__all__ = ["balance_ranks", "field_length", "fit_budget", "value_lengths"]

_FIELDS = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])
_ANY = msgspec.msgpack.Decoder()
#: The array extension's payload: ``[dtype, shape, data]``.
_NDARRAY = msgspec.msgpack.Decoder(tuple[str, list[int], msgspec.Raw])
_ARRAY_EXT = 1


def _ext_payload(raw: bytes) -> tuple[int, bytes] | None:
    """The type and payload of a msgpack extension value, None for anything else."""
    head = raw[0]
    fixed = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
    if head in fixed:
        return raw[1], raw[2 : 2 + fixed[head]]
    sizes = {0xC7: (1, "B"), 0xC8: (2, ">H"), 0xC9: (4, ">I")}
    if head in sizes:
        width, fmt = sizes[head]
        (n,) = struct.unpack_from(fmt, raw, 1)
        return raw[1 + width], raw[2 + width : 2 + width + n]
    return None


def raw_length(raw: bytes) -> int:
    """The length of one msgpack value (see the module docstring)."""
    if not raw:
        return 0
    head = raw[0]
    if 0x90 <= head <= 0x9F or 0x80 <= head <= 0x8F:
        return head & 0x0F
    if head in (0xDC, 0xDE):
        return int(struct.unpack_from(">H", raw, 1)[0])
    if head in (0xDD, 0xDF):
        return int(struct.unpack_from(">I", raw, 1)[0])
    if head == 0xC0:
        return 0
    ext = _ext_payload(raw)
    if ext is not None:
        if ext[0] == _ARRAY_EXT:
            try:
                _, shape, _ = _NDARRAY.decode(ext[1])
            except (msgspec.DecodeError, msgspec.ValidationError):
                return 1
            return shape[0] if shape else 1
        return len(ext[1])
    try:
        value: Any = _ANY.decode(raw)
    except (msgspec.DecodeError, ValueError):
        return 1
    if isinstance(value, str | bytes):
        return len(value)
    return 1


def field_length(value: bytes, name: str) -> int:
    """The length of field ``name`` of a stored value (a map); 0 when it has none."""
    try:
        fields = _FIELDS.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):
        return 0
    raw = fields.get(name)
    return 0 if raw is None else raw_length(bytes(raw))


def value_lengths(value: bytes, names: Sequence[str] | None) -> dict[str, int]:
    """The lengths of the fields ``names`` of a stored value (every field when None)."""
    try:
        fields = _FIELDS.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):
        fields = {}  # not a map: it has no fields
    if names is None:
        return {name: raw_length(bytes(raw)) for name, raw in fields.items()}
    return {name: raw_length(bytes(fields[name])) if name in fields else 0 for name in names}


def fit_budget(
    lengths: Sequence[int], group_size: int | None, max_tokens: int, batch_size: int
) -> tuple[int, bool]:
    """How many of the picked items (oldest first; consecutive whole groups of
    ``group_size``) fit ``max_tokens``, at least the first group; and whether the claim
    is full (the next item or group would pass the budget, or ``batch_size`` is reached).
    """
    unit = group_size or 1
    total = kept = 0
    for start in range(0, len(lengths) - unit + 1, unit):
        size = sum(lengths[start : start + unit])
        if kept and total + size > max_tokens:
            return kept, True
        total += size
        kept += unit
        if total >= max_tokens or kept >= batch_size:
            return kept, True
    return kept, False


def balance_ranks(
    lengths: Sequence[int], groups: Sequence[str | None], world_size: int
) -> list[list[int]]:
    """Indices of the items per rank: whole groups (items without a group alone), each
    given, longest first, to the rank whose sum is smallest (the lowest rank on ties)."""
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
