"""``/v1/tables/{table}/sample``: draw a batch with the table's sampler."""

from __future__ import annotations

import msgspec
from fastapi import APIRouter, Request, Response

from rlreplay.app.api.bodies import parse_sample
from rlreplay.app.api.column_answers import sample_columns_json, sample_columns_msgpack
from rlreplay.app.api.deps import TableName, serve_body
from rlreplay.app.api.encoding import JSON, MSGPACK, BodyFormat, Reply, dump_json
from rlreplay.app.api.envelopes import sample_json, sample_msgpack
from rlreplay.app.api.openapi import BODY_ERRORS, V1_ERRORS, answers, request_body
from rlreplay.app.api.window_answers import window_sample_reply
from rlreplay.app.engine.engine import Engine
from rlreplay.app.metrics import Metrics
from rlreplay.app.tables.tag_index import parse_where
from rlreplay.wire.errors import DeadlineExceeded, TableNotFound
from rlreplay.wire.schemas import SampleColumns, SampleRequest, SampleResponse
from rlreplay.wire.window_schemas import WindowColumns, WindowSampleRequest

__all__ = ["router", "sample_reply"]

router = APIRouter(prefix="/v1/tables/{table}", tags=["sampling"])


@router.post(
    "/sample",
    response_model=None,
    openapi_extra=request_body(SampleRequest, WindowSampleRequest, overlapping=True),
    responses=answers(
        {
            200: (
                (SampleResponse, SampleColumns, WindowColumns),
                'The sampled items; with `layout: "columns"` stacked by field. From an '
                "episode table, windows: `[B, W, ...]` per field.",
            )
        },
        TableNotFound,
        DeadlineExceeded,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def sample(request: Request, table: TableName) -> Response:
    """Sample a batch of items, or of windows from an episode table.

    Waits up to `timeout_ms` (default 10000) for the table's rate limiter, then answers 504
    `deadline_exceeded`. Each pick carries its `probability` in one draw and its importance
    `weight` (1.0 but for the prioritized sampler). With `layout: "columns"` each field of
    the values is stacked along a new first axis; values that do not stack are 422
    `validation_error` naming the field, and the sample then consumes nothing.

    An episode table takes the window form (`length`, `burn_in`, `start_every`, `pad`,
    `fields`, `n_step`, ...) and answers windows of `burn_in + length` steps as columns
    `[B, W, ...]` with their `mask` (and `return`, `discount`, `next` with `n_step`); it
    also waits up to `timeout_ms` for a window it may start. An item table refuses the window
    form, and an episode table the item form, with 422 `validation_error`.
    """
    return await serve_body(request, table, sample_reply)


async def sample_reply(
    engine: Engine, metrics: Metrics, table: str, body: bytes, fmt: BodyFormat, as_msgpack: bool
) -> Reply:
    """The work of :func:`sample` (a :data:`~rlreplay.app.api.deps.BodyHandler`)."""
    if engine.windows.serves(table):
        return await window_sample_reply(engine, metrics, table, body, fmt, as_msgpack)
    params = parse_sample(body, fmt)
    columns = params.layout == "columns"
    items = await engine.reads.sample_batch(
        table,
        params.batch_size,
        timeout_s=params.timeout_ms / 1000,
        include_values=params.include_values,
        stacked=columns,
        where=None if params.where is msgspec.UNSET else parse_where(params.where),
    )
    metrics.count_items("sample", len(items))
    if columns:
        if as_msgpack:
            return Reply(sample_columns_msgpack(items), MSGPACK)
        return Reply(dump_json(sample_columns_json(items)), JSON)
    if as_msgpack:
        return Reply(sample_msgpack(items), MSGPACK)
    return Reply(dump_json(sample_json(items)), JSON)
