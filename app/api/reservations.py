"""Reservations (generation pacing): ``POST /v1/tables/{table}/reservations`` and
``DELETE /v1/tables/{table}/reservations/{reservation}``.

A generator reserves slots before it generates and fills them by pushing with
``"reservation": id``; the server grants slots only while reserved slots plus items not
yet consumed stay within the table's ``admission.max_ahead`` and the generator's version
is within the staleness window (the contract's "Rollout tables at scale").
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from rlreplay.app.api.bodies import decode_struct
from rlreplay.app.api.deps import AcceptsMsgpack, EngineDep, TableName
from rlreplay.app.api.encoding import encode, read_body
from rlreplay.app.api.openapi import BODY_ERRORS, V1_ERRORS, answers, request_body
from rlreplay.wire.errors import DeadlineExceeded, LeaseNotFound, TableNotFound, VersionConflict
from rlreplay.wire.rollout_scale import (
    ReservationAnswer,
    ReservationRequest,
    ReservationReturned,
)

__all__ = ["router"]

router = APIRouter(prefix="/v1/tables/{table}", tags=["rollouts"])

ReservationId = Annotated[str, Path(min_length=1, max_length=64, description="A reservation's id.")]


@router.post(
    "/reservations",
    status_code=201,
    response_model=None,
    openapi_extra=request_body(ReservationRequest),
    responses=answers(
        {201: (ReservationAnswer, "Slots granted: fill them by pushing with the id.")},
        TableNotFound,
        VersionConflict,
        DeadlineExceeded,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def reserve(
    request: Request, table: TableName, engine: EngineDep, msgpack_out: AcceptsMsgpack
) -> Response:
    """Reserve up to `count` slots before generating `count` rollouts at `version`.

    Grants slots once reserved slots plus items not yet acknowledged by every task in
    `delete_after_ack` stay within the table's `admission.max_ahead` (every slot asked for
    on a table without `admission`), waiting (no polling) up to `wait_ms` for at least one,
    then 504 `deadline_exceeded`. A `version` below the table's version minus its
    `max_staleness` is 409 `version_conflict` at once: its rollouts would be dropped.
    Unfilled slots return after `ttl_s` (default 600).
    """
    body, fmt = await read_body(request)
    asked = decode_struct(body, fmt, ReservationRequest)
    granted = await engine.reservations.reserve(
        table, asked.count, asked.version, wait_ms=asked.wait_ms, ttl_s=asked.ttl_s
    )
    answer = {
        "reservation": granted.id,
        "granted": granted.granted,
        "expires_at": granted.expires_at,
    }
    return encode(answer, msgpack_body=msgpack_out, status_code=201)


@router.delete(
    "/reservations/{reservation}",
    response_model=None,
    responses=answers(
        {200: (ReservationReturned, "The unfilled slots are returned.")},
        TableNotFound,
        LeaseNotFound,
        *V1_ERRORS,
    ),
)
async def give_back(
    table: TableName, reservation: ReservationId, engine: EngineDep, msgpack_out: AcceptsMsgpack
) -> Response:
    """Return a reservation's unfilled slots (404 `lease_not_found` once it is not live)."""
    returned = engine.reservations.cancel(table, reservation)
    return encode({"returned": returned}, msgpack_body=msgpack_out)
