"""``/v1/tables``: create, list, describe and drop tables."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from rlreplay.app.api.bodies import parse_table_config
from rlreplay.app.api.deps import AcceptsMsgpack, EngineDep, TableName
from rlreplay.app.api.encoding import body_format, encode
from rlreplay.app.api.openapi import BODY_ERRORS, V1_ERRORS, answers, request_body
from rlreplay.app.tables.config import TableConfig
from rlreplay.wire.errors import TableExists, TableNotFound
from rlreplay.wire.schemas import TableInfo, TableList

__all__ = ["router"]

router = APIRouter(prefix="/v1/tables", tags=["tables"])

_CONFIG_EXAMPLE = {
    "sampler": {"type": "prioritized", "exponent": 0.6, "is_exponent": 0.4},
    "remover": {"type": "fifo"},
    "max_size": 1_000_000,
    "max_times_sampled": 0,
    "rate_limiter": {"type": "min_size", "min_size": 1000},
}


@router.put(
    "/{table}",
    status_code=201,
    response_model=None,
    openapi_extra=request_body(
        TableConfig,
        example=_CONFIG_EXAMPLE,
        required=False,
    ),
    responses=answers(
        {
            201: (TableInfo, "Created."),
            200: (TableInfo, "It exists with the same config."),
        },
        TableExists,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def create_table(
    request: Request, table: TableName, engine: EngineDep, msgpack_out: AcceptsMsgpack
) -> Response:
    """Create a table (idempotent for the same config).

    An empty body creates the table with the default config (uniform sampler, FIFO remover,
    unbounded). A table of that name with a different config is 409 ``table_exists``.
    """
    body = await request.body()
    fmt = body_format(request) if body else None
    config = parse_table_config(body, fmt)
    created = await engine.create_table(table, config)
    status = 201 if created else 200
    return encode(engine.describe(table), msgpack_body=msgpack_out, status_code=status)


@router.get(
    "",
    response_model=None,
    responses=answers({200: (TableList, "Every table.")}, *V1_ERRORS),
)
async def list_tables(engine: EngineDep, msgpack_out: AcceptsMsgpack) -> Response:
    """List the tables with their config and stats."""
    tables = []
    for name in engine.table_names():
        try:
            tables.append(engine.describe(name))
        except TableNotFound:  # dropped meanwhile
            continue
    return encode({"tables": tables}, msgpack_body=msgpack_out)


@router.get(
    "/{table}",
    response_model=None,
    responses=answers({200: (TableInfo, "The table.")}, TableNotFound, *V1_ERRORS),
)
async def get_table(table: TableName, engine: EngineDep, msgpack_out: AcceptsMsgpack) -> Response:
    """Describe a table: config and stats."""
    return encode(engine.describe(table), msgpack_body=msgpack_out)


@router.delete(
    "/{table}",
    status_code=204,
    response_model=None,
    responses=answers({204: (None, "Dropped.")}, TableNotFound, *V1_ERRORS),
)
async def drop_table(table: TableName, engine: EngineDep) -> Response:
    """Drop a table and all its data."""
    await engine.drop_table(table)
    return Response(status_code=204)
