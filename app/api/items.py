"""``/v1/tables/{table}/items``: push, read, delete items and update their priorities.

Msgpack is the fast path: pushed values are sliced out of the body as raw bytes and stored
as is, and read values are spliced into the answer as is (:mod:`rlreplay.app.api.envelopes`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from msgspec import UNSET
from starlette.convertors import PathConvertor, register_url_convertor

from rlreplay.app.api.bodies import (
    check_key,
    parse_delete,
    parse_keys,
    parse_priorities,
)
from rlreplay.app.api.column_answers import (
    FoundColumns,
    item_columns_json,
    item_columns_msgpack,
)
from rlreplay.app.api.column_bodies import parse_any_push
from rlreplay.app.api.deps import ItemKey, TableName, engine_of, metrics_of, serve_body
from rlreplay.app.api.encoding import (
    JSON,
    MSGPACK,
    BodyFormat,
    Reply,
    dump_json,
    encode,
    encode_reply,
    wants_msgpack,
)
from rlreplay.app.api.envelopes import item_batch_msgpack, item_json, item_msgpack, items_json
from rlreplay.app.api.openapi import BODY_ERRORS, V1_ERRORS, answers, request_body
from rlreplay.app.api.window_answers import window_priorities_reply
from rlreplay.app.api.write_status import status_of
from rlreplay.app.engine.engine import Engine
from rlreplay.app.metrics import Metrics
from rlreplay.app.writer.request_ids import answer_count
from rlreplay.wire.errors import (
    DeadlineExceeded,
    ItemNotFound,
    Overloaded,
    StorageFull,
    TableNotFound,
)
from rlreplay.wire.schemas import (
    Accepted,
    ColumnsPushRequest,
    DeleteRequest,
    ItemColumns,
    ItemList,
    ItemOut,
    KeysRequest,
    PrioritiesRequest,
    PrioritiesUpdated,
    PushCommitted,
    PushRequest,
)
from rlreplay.wire.window_schemas import WindowPrioritiesRequest

__all__ = [
    "batch_delete_reply",
    "batch_get_reply",
    "priorities_reply",
    "push_reply",
    "router",
]


class _AnyKey(PathConvertor):
    """A key as the contract allows it, ``/`` and newlines included (``path`` stops at a
    newline: its ``.*`` does not match one, and the route then saw an empty key)."""

    regex = r"[\s\S]*"


register_url_convertor("any", _AnyKey())

router = APIRouter(prefix="/v1/tables/{table}", tags=["items"])


@router.post(
    "/items",
    status_code=202,
    response_model=None,
    openapi_extra=request_body(PushRequest, ColumnsPushRequest),
    responses=answers(
        {
            202: (Accepted, "Accepted: every later read sees the items."),
            200: (PushCommitted, "With `wait: true`: the writer applied them."),
        },
        TableNotFound,
        Overloaded,
        StorageFull,
        DeadlineExceeded,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def push_items(request: Request, table: TableName) -> Response:
    """Push items (an existing key is replaced).

    Answers 202 `{"accepted": n}` as soon as the items are accepted (every later get,
    batchGet and sample sees them), or with `wait: true` 200 `{"committed": n}` once the
    writer applied them. A full write queue is 503 `overloaded` with `Retry-After`;
    nothing is accepted then. The second form, `{"keys", "columns", "priorities"?}`, pushes
    item `i` with the value `{field: columns[field][i]}`, as the per-item form would.
    """
    return await serve_body(request, table, push_reply)


async def push_reply(
    engine: Engine,
    metrics: Metrics,
    table: str,
    body: bytes | memoryview,
    fmt: BodyFormat,
    as_msgpack: bool,
) -> Reply:
    """The work of :func:`push_items` (a :data:`~rlreplay.app.api.deps.BodyHandler`); a long
    msgpack body is read where it lies, in the buffer the socket read it into."""
    if fmt is not BodyFormat.MSGPACK and type(body) is not bytes:
        body = bytes(body)
    push = parse_any_push(body, fmt)
    answer = await engine.admission.push_answer(
        table,
        push.items,
        wait=push.wait,
        validated=True,
        body=push.raw,
        request_id=push.request_id,
        columns=push.columns,
        reservation=push.reservation,
    )
    if push.reservation is not None:
        engine.reservations.fill(table, push.reservation, len(push.items))
    metrics.count_items("push", answer_count(answer))
    return encode_reply(answer, msgpack_body=as_msgpack, status=status_of(answer))


@router.post(
    "/items:batchGet",
    response_model=None,
    openapi_extra=request_body(KeysRequest),
    responses=answers(
        {
            200: (
                (ItemList, ItemColumns),
                'The items in the order asked, null where missing; with `layout: "columns"`'
                " the items found, stacked by field, and the keys missing.",
            )
        },
        TableNotFound,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def batch_get_items(request: Request, table: TableName) -> Response:
    """Read many items at once, in the order asked (null where missing).

    With `layout: "columns"` the answer holds the items found, each field of their values
    stacked along a new first axis, and the keys missing; values that do not stack are
    422 `validation_error`, naming the field.
    """
    return await serve_body(request, table, batch_get_reply)


async def batch_get_reply(
    engine: Engine, metrics: Metrics, table: str, body: bytes, fmt: BodyFormat, as_msgpack: bool
) -> Reply:
    """The work of :func:`batch_get_items` (a :data:`~rlreplay.app.api.deps.BodyHandler`)."""
    request = parse_keys(body, fmt)
    keys = request.keys
    if request.layout == "columns":
        found = FoundColumns(await engine.reads.get_batch(table, keys))
        metrics.count_items("get", len(keys))
        if as_msgpack:
            return Reply(item_columns_msgpack(found), MSGPACK)
        return Reply(dump_json(item_columns_json(found)), JSON)
    batch = await engine.reads.get_batch(table, keys)
    metrics.count_items("get", len(keys))
    if as_msgpack:
        return Reply(item_batch_msgpack(batch), MSGPACK)
    return Reply(dump_json(items_json(batch.items())), JSON)


@router.post(
    "/items:batchDelete",
    status_code=202,
    response_model=None,
    openapi_extra=request_body(DeleteRequest),
    responses=answers(
        {
            202: (Accepted, "Accepted: every later read misses the keys."),
            200: (PushCommitted, "With `wait: true`: the writer applied the deletes."),
        },
        TableNotFound,
        Overloaded,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def batch_delete_items(request: Request, table: TableName) -> Response:
    """Delete many items at once (missing keys are no error)."""
    return await serve_body(request, table, batch_delete_reply)


async def batch_delete_reply(
    engine: Engine, metrics: Metrics, table: str, body: bytes, fmt: BodyFormat, as_msgpack: bool
) -> Reply:
    """The work of :func:`batch_delete_items` (a :data:`~rlreplay.app.api.deps.BodyHandler`)."""
    delete = parse_delete(body, fmt)
    rid = None if delete.request_id is UNSET else delete.request_id
    answer = await engine.admission.delete_answer(
        table, delete.keys, wait=delete.wait, request_id=rid
    )
    metrics.count_items("delete", answer_count(answer))
    return encode_reply(answer, msgpack_body=as_msgpack, status=status_of(answer))


@router.get(
    "/items/{key:any}",
    response_model=None,
    responses=answers({200: (ItemOut, "The item.")}, TableNotFound, ItemNotFound, *V1_ERRORS),
)
async def get_item(request: Request, table: TableName, key: ItemKey) -> Response:
    """Read one item."""
    item = await engine_of(request).get(table, check_key(key))
    if item is None:
        raise ItemNotFound(f"no item with key {key!r} in table {table!r}")
    metrics_of(request).count_items("get", 1)
    if wants_msgpack(request):
        return Response(item_msgpack(item), media_type=MSGPACK)
    return Response(dump_json(item_json(item)), media_type=JSON)


@router.delete(
    "/items/{key:any}",
    status_code=202,
    response_model=None,
    responses=answers(
        {202: (Accepted, "Accepted: every later read misses the key.")},
        TableNotFound,
        Overloaded,
        *V1_ERRORS,
    ),
)
async def delete_item(request: Request, table: TableName, key: ItemKey) -> Response:
    """Delete one item (a missing key is no error)."""
    n = await engine_of(request).delete(table, [check_key(key)])
    metrics_of(request).count_items("delete", n)
    return encode({"accepted": n}, msgpack_body=wants_msgpack(request), status_code=202)


@router.post(
    "/priorities",
    response_model=None,
    openapi_extra=request_body(PrioritiesRequest, WindowPrioritiesRequest),
    responses=answers(
        {
            200: (
                PrioritiesUpdated,
                "Updated; unknown keys (or window starts no longer held) are skipped and counted.",
            )
        },
        TableNotFound,
        Overloaded,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def update_priorities(request: Request, table: TableName) -> Response:
    """Update the priorities of items, or of window starts of an episode table.

    An episode table takes `{"windows": [{"episode", "start", "priority" | "td"}], "eta"?}`:
    each window start's priority as given, or `eta·max|td| + (1 - eta)·mean|td|` of the TD
    errors of the window sampled from it.
    """
    return await serve_body(request, table, priorities_reply)


async def priorities_reply(
    engine: Engine, metrics: Metrics, table: str, body: bytes, fmt: BodyFormat, as_msgpack: bool
) -> Reply:
    """The work of :func:`update_priorities` (a :data:`~rlreplay.app.api.deps.BodyHandler`)."""
    if engine.windows.serves(table):
        return await window_priorities_reply(engine, metrics, table, body, fmt, as_msgpack)
    priorities = parse_priorities(body, fmt).priorities
    updated, missing = await engine.admission.update_priorities(table, priorities)
    metrics.count_items("priorities", updated)
    return encode_reply({"updated": updated, "missing": missing}, msgpack_body=as_msgpack)
