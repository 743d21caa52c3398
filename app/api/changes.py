"""``/v1/tables/{table}/changes`` and ``/index``: what a follower (the GPU sidecar) reads
to keep a table's selection state in its own memory."""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Query, Response

from rlreplay.app.api.deps import AcceptsMsgpack, EngineDep, TableName
from rlreplay.app.api.encoding import JSON, MSGPACK, dump_json
from rlreplay.app.api.openapi import V1_ERRORS, answers
from rlreplay.app.engine.feed import read_changes, read_index
from rlreplay.wire.codec import packb, to_jsonable
from rlreplay.wire.errors import Gone, TableNotFound
from rlreplay.wire.schemas import MAX_CHANGES_LIMIT, MAX_CHANGES_WAIT_MS, ChangeList, TableIndex

__all__ = ["router"]

router = APIRouter(prefix="/v1/tables/{table}", tags=["followers"])


@router.get(
    "/changes",
    response_model=None,
    responses=answers(
        {200: (ChangeList, "The changes after `since`, oldest first.")},
        TableNotFound,
        Gone,
        *V1_ERRORS,
    ),
)
async def changes(
    table: TableName,
    engine: EngineDep,
    msgpack_out: AcceptsMsgpack,
    since: Annotated[
        int, Query(ge=0, description="The last event the follower applied (0: none).")
    ] = 0,
    limit: Annotated[
        int, Query(ge=1, le=MAX_CHANGES_LIMIT, description="Most events to answer.")
    ] = 10_000,
    wait_ms: Annotated[
        int,
        Query(ge=0, le=MAX_CHANGES_WAIT_MS, description="Wait this long for a first event."),
    ] = 0,
) -> Response:
    """Follow a table's changes (puts, deletes, priority updates) in the writer's order.

    A long poll: with no event after `since`, waits up to `wait_ms` for one. The server keeps
    the last `--changes-keep` events, counted from the first time anyone follows the table;
    a `since` older than that, or past the last event (another `epoch`: the server
    restarted), is 410 `gone`, and the follower reloads from `/index`.
    """
    answer = await read_changes(engine.core, table, since, limit, wait_ms / 1000)
    if msgpack_out:
        return Response(msgspec.msgpack.encode(answer), media_type=MSGPACK)
    return Response(msgspec.json.encode(answer), media_type=JSON)


@router.get(
    "/index",
    response_model=None,
    responses=answers(
        {200: (TableIndex, "The table's selection state as of event `seq`.")},
        TableNotFound,
        *V1_ERRORS,
    ),
)
async def index(table: TableName, engine: EngineDep, msgpack_out: AcceptsMsgpack) -> Response:
    """A table's whole selection state: keys, priorities and insertion times as columns.

    Keys come oldest insert first, with the number of the last change they include; a
    follower applies the changes after it from `/changes`.
    """
    answer = await read_index(engine.core, table)
    if msgpack_out:
        return Response(packb(answer), media_type=MSGPACK)
    return Response(dump_json(to_jsonable(answer)), media_type=JSON)
