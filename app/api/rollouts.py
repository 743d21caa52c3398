"""Rollout tables: ``items:patch``, ``claim``, leases' ``:ack`` and ``:release``, ``tasks``
and ``version`` under ``/v1/tables/{table}``.

A rollout is written in parts by several tasks (patches) and consumed by each consumer
task once, under leases (claims); the contract's "Rollout tables" section says how.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Path, Request, Response

from rlreplay.app.api.deps import AcceptsMsgpack, EngineDep, TableName, serve_body
from rlreplay.app.api.encoding import (
    JSON,
    MSGPACK,
    BodyFormat,
    Reply,
    body_format,
    dump_json,
    encode,
    encode_reply,
    read_body,
)
from rlreplay.app.api.envelopes import value_json
from rlreplay.app.api.openapi import BODY_ERRORS, V1_ERRORS, answers, request_body
from rlreplay.app.api.rollout_bodies import (
    parse_claim,
    parse_lease_keys,
    parse_patch,
    parse_version,
)
from rlreplay.app.api.write_status import status_of
from rlreplay.app.engine.claim_shape import ClaimShape
from rlreplay.app.engine.claims import ClaimedItem
from rlreplay.app.engine.engine import Engine
from rlreplay.app.metrics import Metrics
from rlreplay.app.tables.rollouts import Lease
from rlreplay.app.writer.request_ids import answer_count
from rlreplay.wire.errors import (
    DeadlineExceeded,
    LeaseNotFound,
    Overloaded,
    StorageFull,
    TableNotFound,
    VersionConflict,
)
from rlreplay.wire.schemas import (
    Acked,
    ClaimAnswer,
    ClaimRequest,
    LeaseKeysRequest,
    PatchAnswer,
    PatchRequest,
    Released,
    TasksAnswer,
    VersionAnswer,
    VersionRequest,
)

__all__ = ["claim_reply", "patch_reply", "router"]

router = APIRouter(prefix="/v1/tables/{table}", tags=["rollouts"])

LeaseId = Annotated[str, Path(min_length=1, max_length=64, description="A claim's lease id.")]
_ENCODER = msgspec.msgpack.Encoder()


@router.post(
    "/items:patch",
    status_code=202,
    response_model=None,
    openapi_extra=request_body(PatchRequest),
    responses=answers(
        {
            202: (PatchAnswer, "Accepted: every later read sees the new fields."),
            200: (PatchAnswer, "With `wait: true`: the writer applied them."),
        },
        TableNotFound,
        Overloaded,
        StorageFull,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def patch_items(request: Request, table: TableName) -> Response:
    """Set fields of existing items' values, keeping the others.

    Answers 202 `{"accepted": n, "missing": m}` (or 200 `{"committed": n, "missing": m}`
    with `wait: true`): keys that do not exist are skipped and counted in `missing`. A
    patch is durable like a push and every later read sees it; all of it or none.
    """
    return await serve_body(request, table, patch_reply)


async def patch_reply(
    engine: Engine, metrics: Metrics, table: str, body: bytes, fmt: BodyFormat, as_msgpack: bool
) -> Reply:
    """The work of :func:`patch_items` (a :data:`~rlreplay.app.api.deps.BodyHandler`)."""
    patch = parse_patch(body, fmt)
    answer = await engine.claims.patch(
        table, patch.items, wait=patch.wait, request_id=patch.request_id, tags=patch.tags
    )
    metrics.count_items("patch", answer_count(answer))
    return encode_reply(answer, msgpack_body=as_msgpack, status=status_of(answer))


@router.post(
    "/claim",
    response_model=None,
    openapi_extra=request_body(ClaimRequest),
    responses=answers(
        {200: (ClaimAnswer, "A lease on the items handed out.")},
        TableNotFound,
        DeadlineExceeded,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def claim(request: Request, table: TableName) -> Response:
    """Claim the oldest items ready for a task, under a lease.

    Hands out items that have every field in `fields`, that the task has neither
    acknowledged nor holds, whose `version` is at least `min_version` (and within the
    table's staleness window), oldest first, with only those fields in their values; with
    `group_size`, whole groups only. Waits up to `wait_ms` for `batch_size` of them, then
    answers 504 `deadline_exceeded`, or with `partial: true` what is ready.
    """
    return await serve_body(request, table, claim_reply)


async def claim_reply(
    engine: Engine, metrics: Metrics, table: str, body: bytes, fmt: BodyFormat, as_msgpack: bool
) -> Reply:
    """The work of :func:`claim` (a :data:`~rlreplay.app.api.deps.BodyHandler`)."""
    params: ClaimRequest = parse_claim(body, fmt)
    shape = ClaimShape.of(
        where=_given(params.where),
        select=_given(params.select),
        values=params.values,
        max_tokens=_given(params.max_tokens),
        length_field=_given(params.length_field),
        world_size=_given(params.world_size),
    )
    lease, items = await engine.claims.claim(
        table,
        params.task,
        params.batch_size,
        fields=None if params.fields is msgspec.UNSET else params.fields,
        group_size=None if params.group_size is msgspec.UNSET else params.group_size,
        lease_s=params.lease_s,
        wait_ms=params.wait_ms,
        partial=params.partial,
        min_version=None if params.min_version is msgspec.UNSET else params.min_version,
        shape=shape,
    )
    metrics.count_items("claim", len(items))
    answer = _claim_answer(lease, items, raw=as_msgpack)
    if shape.world_size is not None:
        ranks = None if lease is None else lease.ranks
        answer["ranks"] = ranks if ranks is not None else [[] for _ in range(shape.world_size)]
    if as_msgpack:
        return Reply(_ENCODER.encode(answer), MSGPACK)
    return Reply(dump_json(answer), JSON)


def _given(value: Any) -> Any:
    """None for a field the body left out."""
    return None if value is msgspec.UNSET else value


def _claim_answer(lease: Lease | None, items: list[ClaimedItem], *, raw: bool) -> dict[str, Any]:
    """``{"lease", "expires_at", "items"}``: values spliced in as stored (msgpack), or in
    their JSON form; ``tags`` where an item has any; with ``values: false`` each item's
    ``lengths`` instead of its ``value``."""
    out = []
    for it in items:
        entry: dict[str, Any] = {"key": it.key}
        if it.lengths is not None:
            entry["lengths"] = it.lengths
        else:
            value = it.value if it.value is not None else b"\xc0"
            entry["value"] = msgspec.Raw(value) if raw else value_json(value)
        entry["priority"] = it.priority
        entry["group"] = it.group
        entry["version"] = it.version
        if it.tags:
            entry["tags"] = it.tags
        out.append(entry)
    return {
        "lease": "" if lease is None else lease.id,
        "expires_at": 0.0 if lease is None else lease.expires_at,
        "items": out,
    }


async def _lease_keys(request: Request) -> list[str] | None:
    body = await request.body()
    return parse_lease_keys(body, body_format(request) if body else None)


@router.post(
    "/leases/{lease}:ack",
    response_model=None,
    openapi_extra=request_body(LeaseKeysRequest, required=False),
    responses=answers(
        {200: (Acked, "Those items count as consumed by the lease's task, durably.")},
        TableNotFound,
        LeaseNotFound,
        Overloaded,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def ack(
    request: Request,
    table: TableName,
    lease: LeaseId,
    engine: EngineDep,
    msgpack_out: AcceptsMsgpack,
) -> Response:
    """Acknowledge a lease's items (all of it when `keys` is omitted).

    Acknowledging again what the lease already acknowledged changes nothing and counts
    them again, so a retried ack is safe. A lease never issued, or expired, is 404
    `lease_not_found`.
    """
    acked = await engine.claims.ack(table, lease, await _lease_keys(request))
    return encode({"acked": acked}, msgpack_body=msgpack_out)


@router.post(
    "/leases/{lease}:release",
    response_model=None,
    openapi_extra=request_body(LeaseKeysRequest, required=False),
    responses=answers(
        {200: (Released, "Those items are ready for the lease's task again.")},
        TableNotFound,
        LeaseNotFound,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def release(
    request: Request,
    table: TableName,
    lease: LeaseId,
    engine: EngineDep,
    msgpack_out: AcceptsMsgpack,
) -> Response:
    """Release a lease's items (all of it when `keys` is omitted): ready for its task again."""
    released = await engine.claims.release(table, lease, await _lease_keys(request))
    return encode({"released": released}, msgpack_body=msgpack_out)


@router.get(
    "/tasks",
    response_model=None,
    responses=answers({200: (TasksAnswer, "Per task counts.")}, TableNotFound, *V1_ERRORS),
)
async def tasks(table: TableName, engine: EngineDep, msgpack_out: AcceptsMsgpack) -> Response:
    """Per task: items ready now, leased, acknowledged, and lease expiries; the version."""
    return encode(await engine.claims.tasks_now(table), msgpack_body=msgpack_out)


@router.put(
    "/version",
    response_model=None,
    openapi_extra=request_body(VersionRequest),
    responses=answers(
        {200: (VersionAnswer, "The table's version, and the rollouts dropped as stale.")},
        TableNotFound,
        VersionConflict,
        Overloaded,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def set_version(
    request: Request, table: TableName, engine: EngineDep, msgpack_out: AcceptsMsgpack
) -> Response:
    """Set the trainer's current policy version (it never goes back: 409 `version_conflict`).

    With the table's `max_staleness: s`, rollouts whose version is below `version - s` are
    never handed out again by claim or sample, and are deleted (counted in `dropped_stale`).
    A version more than 1,000,000 past the current one answers 422 `validation_error`
    unless the body says `"force": true`: no training run gets there in one step, and a
    mistaken one would drop every rollout for good.
    """
    body, fmt = await read_body(request)
    asked = parse_version(body, fmt)
    answer = await engine.claims.set_version(table, asked.version, force=asked.force is True)
    return encode(answer, msgpack_body=msgpack_out)
