"""Sample and priorities on an episode table: windows and their starts' priorities.

``POST /v1/tables/{table}/sample`` and ``/priorities`` are one route each for both kinds of
table; their handlers (:func:`~rlreplay.app.api.sampling.sample_reply`,
:func:`~rlreplay.app.api.items.priorities_reply`) hand an episode table's request to the
handlers here. A window sample answers columns (:class:`~rlreplay.wire.window_schemas.
WindowColumns`), in msgpack or JSON as a sample with ``layout: "columns"`` does.
"""

from __future__ import annotations

from typing import Any

from msgspec import UnsetType

from rlreplay.app.api.bodies import parse_window_priorities, parse_window_sample
from rlreplay.app.api.column_answers import window_columns_json, window_columns_msgpack
from rlreplay.app.api.encoding import JSON, MSGPACK, BodyFormat, Reply, dump_json, encode_reply
from rlreplay.app.engine.engine import Engine
from rlreplay.app.engine.windows import WindowSample, window_priority
from rlreplay.app.episodes.windows import WindowSlices
from rlreplay.app.metrics import Metrics
from rlreplay.app.tables.stacking import Column, RowSlices
from rlreplay.wire.arrays import wire_dtype
from rlreplay.wire.errors import ValidationFailed

__all__ = ["window_priorities_reply", "window_sample_reply"]

#: Fields of an item sample's body that a window sample does not take.
_ITEM_SAMPLE_FIELDS = ("include_values", "layout")


async def window_sample_reply(
    engine: Engine, metrics: Metrics, table: str, body: bytes, fmt: BodyFormat, as_msgpack: bool
) -> Reply:
    """Windows sampled from episode table ``table`` (a
    :data:`~rlreplay.app.api.deps.BodyHandler`)."""
    try:
        params = parse_window_sample(body, fmt)
    except ValidationFailed as exc:
        item_fields = [f for f in _ITEM_SAMPLE_FIELDS if f"`{f}`" in str(exc)]
        if not item_fields:
            raise
        raise ValidationFailed(
            f"table {table!r} holds episodes, sampled as windows: pass `length` (steps per "
            f"window; burn_in, n_step and the others as for windows) instead of "
            f"`{item_fields[0]}`, which is for item tables"
        ) from None
    sample = await engine.windows.sample(table, params)
    metrics.count_items("sample", len(sample.episodes))
    entries = window_entries(sample)
    if as_msgpack:
        return Reply(window_columns_msgpack(entries), MSGPACK)
    return Reply(dump_json(window_columns_json(entries)), JSON)


def window_entries(sample: WindowSample) -> list[tuple[str, Any]]:
    """The answer's entries, in the contract's order."""
    batch = sample.batch
    entries: list[tuple[str, Any]] = [
        ("episodes", sample.episodes),
        ("starts", sample.starts),
        ("columns", {name: _column(a) for name, a in batch.columns.items()}),
        ("mask", batch.mask),
        ("priorities", sample.priorities),
        ("probabilities", sample.probabilities),
        ("weights", sample.weights),
        ("times_sampled", sample.times_sampled),
        ("draw_mass", sample.draw_mass),
        ("selectable", sample.selectable),
    ]
    if batch.targets is not None:
        entries.append(("return", batch.targets.returns))
        entries.append(("discount", batch.targets.discounts))
        entries.append(("next", {name: _column(a) for name, a in (batch.next or {}).items()}))
    return entries


async def window_priorities_reply(
    engine: Engine, metrics: Metrics, table: str, body: bytes, fmt: BodyFormat, as_msgpack: bool
) -> Reply:
    """New priorities of window starts of episode table ``table``: given, or mixed from
    their windows' TD errors (a :data:`~rlreplay.app.api.deps.BodyHandler`)."""
    request = parse_window_priorities(body, fmt)
    windows = [
        (
            w.episode,
            w.start,
            window_priority(
                None if isinstance(w.priority, UnsetType) else w.priority,
                None if isinstance(w.td, UnsetType) else w.td,
                request.eta,
            ),
        )
        for w in request.windows
    ]
    updated, missing = await engine.episodes.set_window_priorities(table, windows)
    metrics.count_items("priorities", updated)
    return encode_reply({"updated": updated, "missing": missing}, msgpack_body=as_msgpack)


def _column(values: Any) -> Column:
    """A field of the windows in its wire form: an array, or slices sent where they lie."""
    if type(values) is WindowSlices:
        return Column(wire_dtype(values.dtype), values.shape, RowSlices(values.parts))
    return Column.of(values)
