"""Putting the answers of several shards back together, and a sample's exact figures.

A sharded sample draws each of its ``n`` picks from shard ``s`` with probability
``π_s = mass_s / Σ mass`` (a multinomial split of the batch), then from that shard's
sampler: a pick's probability in one draw is ``π_s · P_s(i)``, the figure one server holding
every item would report. ``mass_s`` is the shard's ``draw_mass`` stat (``Σ p^alpha`` for a
prioritized table, the item count otherwise); when every shard's mass is 0 (a prioritized
table whose priorities are all 0) the count decides, as one server falls back to uniform.
Prioritized weights are recomputed over the whole batch as the server computes them for one
table: ``(P_min / P(i))^beta`` with ``P_min`` the batch's least probability.

Answers come back in the order asked: :func:`merge_columns` scatters each shard's
:class:`~rlreplay.clients.columns.ColumnBatch` rows to their places, a variable-length field
(``"<field>.cu_seqlens"``) included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from rlreplay.clients.columns import Column, ColumnBatch
from rlreplay.clients.types import Item, Layout
from rlreplay.wire.arrays import BFloat16Array, torch_tensor_type
from rlreplay.wire.errors import ValidationFailed

__all__ = [
    "CU_SEQLENS",
    "Part",
    "assemble_sample",
    "column_rows",
    "draw_weights",
    "merge_columns",
    "merged_description",
    "prioritized_weights",
    "shard_masses",
    "split_picks",
]

CU_SEQLENS: Final = ".cu_seqlens"
#: ``PrioritizedSampler``'s default ``is_exponent`` (beta), for configs that leave it out.
DEFAULT_IS_EXPONENT: Final = 0.4

_SUMMED_STATS: Final = (
    "size",
    "pending_ops",
    "bytes_in_cache",
    "bytes_on_disk",
    "inserts",
    "samples",
    "deletes",
    "evictions_to_disk",
    "populates",
    "index_bytes",
    "selectable",
    "draw_mass",
)

Part = tuple[ColumnBatch, npt.NDArray[np.intp]]
"""A shard's rows and the places in the merged batch they go to."""


def shard_masses(stats: Sequence[Mapping[str, Any]]) -> npt.NDArray[np.float64]:
    """What each shard's share of a sample is proportional to (see the module docstring).

    Args:
        stats: Each shard's table stats (``draw_mass``, ``selectable``).

    Raises:
        ValidationFailed: A server too old to report ``draw_mass``.
    """
    try:
        mass = np.array([float(s["draw_mass"]) for s in stats], dtype=np.float64)
        count = np.array([float(s["selectable"]) for s in stats], dtype=np.float64)
    except KeyError as exc:
        raise ValidationFailed(
            f"a shard's table stats lack {exc}: its server predates sharded sampling"
        ) from None
    return mass if mass.sum() > 0 else count


def split_picks(
    rng: np.random.Generator, places: npt.NDArray[np.intp], mass: Mapping[int, float]
) -> dict[int, npt.NDArray[np.intp]]:
    """Each place of a batch given to a shard with probability its share of ``mass``
    (shards of mass 0 get none): shard -> its places, in order."""
    owners = np.array([s for s, m in mass.items() if m > 0], dtype=np.intp)
    share = np.array([mass[s] for s in owners.tolist()], dtype=np.float64)
    picks = rng.choice(owners, size=len(places), p=share / share.sum())
    return {s: places[picks == s] for s in np.unique(picks).tolist()}


def draw_weights(config: Mapping[str, Any]) -> float | None:
    """beta when the table's sampler is ``prioritized`` (whose weights the client
    recomputes over the merged batch), else None: other samplers' weights stay the
    servers'."""
    sampler = config.get("sampler") or {}
    if sampler.get("type") != "prioritized":
        return None
    return float(sampler.get("is_exponent", DEFAULT_IS_EXPONENT))


def prioritized_weights(
    probabilities: npt.NDArray[np.float64], beta: float
) -> npt.NDArray[np.float64]:
    """``(P_min / P(i))^beta`` over the batch, as ``PrioritizedSampler.weights`` computes it
    for one server (a probability that underflowed to 0 weighs 1)."""
    probs = np.asarray(probabilities, dtype=np.float64)
    if not len(probs):
        return probs.copy()
    ratio = np.divide(probs.min(), probs, out=np.ones_like(probs), where=probs > 0)
    return np.asarray(ratio**beta, dtype=np.float64)


def _bits(column: Column) -> tuple[npt.NDArray[Any], bool]:
    if isinstance(column, BFloat16Array):
        return column.bits, True
    return column, False


def _wrap(array: npt.NDArray[Any], bf16: bool) -> Column:
    return BFloat16Array(array) if bf16 else array


def merge_columns(parts: Sequence[Part], n: int, *, missing: Sequence[str] = ()) -> ColumnBatch:
    """One batch of ``n`` rows from the shards' parts, each row at its place.

    Args:
        parts: Each shard's batch and, per row, its place in ``range(n)``; together the
            places cover ``range(n)`` once.
        n: Rows in the merged batch.
        missing: Keys not found (``get_many``), in the order asked.

    Raises:
        ValidationFailed: The shards stacked a field in ways that do not merge (different
            fields, dtypes or shapes); the message names the field.
    """
    parts = [(batch, places) for batch, places in parts if len(batch)]
    keys: list[str] = [""] * n
    priorities = np.zeros(n, dtype=np.float64)
    times_sampled = np.zeros(n, dtype=np.int64)
    sampled = bool(parts) and parts[0][0].probabilities is not None
    probabilities = np.zeros(n, dtype=np.float64) if sampled else None
    weights = np.zeros(n, dtype=np.float64) if sampled else None
    for batch, places in parts:
        for place, key in zip(places.tolist(), batch.keys, strict=True):
            keys[place] = key
        priorities[places] = batch.priorities
        times_sampled[places] = batch.times_sampled
        if probabilities is not None and weights is not None:
            probabilities[places] = _given(batch.probabilities)
            weights[places] = _given(batch.weights)
    columns: dict[str, Column] = {}
    if parts:
        fields = [name for name in parts[0][0].columns if not name.endswith(CU_SEQLENS)]
        for batch, _ in parts[1:]:
            theirs = [name for name in batch.columns if not name.endswith(CU_SEQLENS)]
            if sorted(theirs) != sorted(fields):
                raise ValidationFailed(
                    f"the shards' values have different fields: {sorted(fields)} and "
                    f"{sorted(theirs)}"
                )
        for name in fields:
            columns.update(_merge_field(name, parts, n))
    return ColumnBatch(
        keys=keys,
        columns=columns,
        priorities=priorities,
        times_sampled=times_sampled,
        probabilities=probabilities,
        weights=weights,
        missing=list(missing),
    )


def _given(values: npt.NDArray[np.float64] | None) -> npt.NDArray[np.float64]:
    if values is None:
        raise ValidationFailed("a shard answered a sample without probabilities")
    return values


def _merge_field(name: str, parts: Sequence[Part], n: int) -> dict[str, Column]:
    """Field ``name`` of every part, scattered to the rows' places."""
    columns = [_bits(batch.columns[name]) for batch, _ in parts]
    bf16 = columns[0][1]
    dtype = columns[0][0].dtype
    if any(flag != bf16 or array.dtype != dtype for array, flag in columns):
        raise ValidationFailed(f"field {name!r}: the shards stacked it with different dtypes")
    ragged = any(name + CU_SEQLENS in batch.columns for batch, _ in parts)
    shapes = {array.shape[1:] for array, _ in columns}
    if not ragged and len(shapes) == 1:
        first = columns[0][0]
        out = np.empty((n, *first.shape[1:]), dtype=dtype)
        for (array, _), (_, places) in zip(columns, parts, strict=True):
            out[places] = array
        return {name: _wrap(out, bf16)}
    if not all(
        name + CU_SEQLENS in batch.columns or array.ndim == 2
        for (array, _), (batch, _) in zip(columns, parts, strict=True)
    ):
        raise ValidationFailed(f"field {name!r}: the shards stacked it with different shapes")
    # A 1-D field whose length varies: one shard may have stacked it as rows of one length.
    lengths = np.zeros(n, dtype=np.int64)
    pieces: list[tuple[npt.NDArray[Any], npt.NDArray[np.int64], npt.NDArray[np.intp]]] = []
    for (array, _), (batch, places) in zip(columns, parts, strict=True):
        offsets_col = batch.columns.get(name + CU_SEQLENS)
        if offsets_col is None:
            rows, width = array.shape
            data = array.reshape(-1)
            offsets = np.arange(rows + 1, dtype=np.int64) * width
        else:
            data = array
            offsets = np.asarray(_bits(offsets_col)[0], dtype=np.int64)
        lengths[places] = np.diff(offsets)
        pieces.append((data, offsets, places))
    new_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    out = np.empty(int(new_offsets[-1]), dtype=dtype)
    for data, offsets, places in pieces:
        shift = np.repeat(new_offsets[places] - offsets[:-1], np.diff(offsets))
        out[np.arange(len(data)) + shift] = data
    return {name: _wrap(out, bf16), name + CU_SEQLENS: new_offsets.astype(np.int32)}


def merged_description(urls: Sequence[str], infos: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One table's descriptions from several servers as one: summed stats, and each
    server's under ``shards``."""
    stats: dict[str, float] = {}
    for info in infos:
        for name, value in info.get("stats", {}).items():
            if name in _SUMMED_STATS:
                stats[name] = stats.get(name, 0) + value
    return {
        "name": infos[0].get("name"),
        "config": infos[0].get("config"),
        "stats": stats,
        "shards": {url: info.get("stats", {}) for url, info in zip(urls, infos, strict=True)},
    }


def column_rows(values: Any, places: npt.NDArray[np.intp]) -> Any:
    """The rows ``places`` of a column given to ``push_columns``."""
    if isinstance(values, np.ndarray):
        return values[places]
    if isinstance(values, BFloat16Array):
        return BFloat16Array(np.ascontiguousarray(values.bits[places]))
    tensor_type = torch_tensor_type()
    if tensor_type is not None and isinstance(values, tensor_type):
        import torch

        return values[torch.from_numpy(places.astype(np.int64)).to(values.device)]
    return np.asarray(values)[places]


def assemble_sample(
    answers: Sequence[tuple[int, npt.NDArray[np.intp], Any]],
    share: Mapping[int, float],
    beta: float | None,
    batch_size: int,
    layout: Layout,
) -> list[Item] | ColumnBatch:
    """The shards' picks at their places in the batch, with one server's probabilities and
    weights. A shard may answer fewer picks than asked (items deleted while their values
    were read): those places are left out, the order of the rest kept."""
    got = np.zeros(batch_size, dtype=bool)
    for _, places, answer in answers:
        got[places[: len(answer)]] = True
    rank = np.cumsum(got) - 1
    n = int(got.sum())
    if layout == "columns":
        parts: list[Part] = []
        for s, places, batch in answers:
            assert isinstance(batch, ColumnBatch)
            if batch.probabilities is not None:
                batch.probabilities = batch.probabilities * share[s]
            parts.append((batch, np.asarray(rank[places[: len(batch)]], dtype=np.intp)))
        merged = merge_columns(parts, n)
        if beta is not None and merged.probabilities is not None:
            merged.weights = prioritized_weights(merged.probabilities, beta)
        return merged
    items: list[Item] = [{}] * n
    for s, places, picked in answers:
        for place, item in zip(rank[places[: len(picked)]].tolist(), picked, strict=True):
            item["probability"] = float(item["probability"]) * share[s]
            items[place] = item
    if beta is not None and items:
        probs = np.array([item["probability"] for item in items], dtype=np.float64)
        for item, weight in zip(items, prioritized_weights(probs, beta).tolist(), strict=True):
            item["weight"] = weight
    return items
