"""``/v1/snapshots``: take a snapshot to the backup URL, list the complete ones."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Request, Response

from rlreplay.app.api.bodies import parse_snapshot
from rlreplay.app.api.deps import AcceptsMsgpack, EngineDep
from rlreplay.app.api.encoding import body_format, encode
from rlreplay.app.api.openapi import BODY_ERRORS, V1_ERRORS, answers, request_body
from rlreplay.wire.errors import NotConfigured, StorageFull, TableNotFound
from rlreplay.wire.schemas import Snapshot, SnapshotList, SnapshotRequest

__all__ = ["router"]

router = APIRouter(prefix="/v1/snapshots", tags=["snapshots"])


@router.post(
    "",
    status_code=201,
    response_model=None,
    openapi_extra=request_body(SnapshotRequest, required=False),
    responses=answers(
        {201: (Snapshot, "Uploaded, its manifest written.")},
        NotConfigured,
        TableNotFound,
        StorageFull,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def take_snapshot(
    request: Request, engine: EngineDep, msgpack_out: AcceptsMsgpack
) -> Response:
    """Take a snapshot of every table (or of `tables`) and upload it to the backup URL.

    Answered once the snapshot is uploaded and its manifest written. The writer goes on
    applying writes while it uploads; a request made while a snapshot runs waits for that
    one and gets its answer. 409 `not_configured` when the server has no `--backup-url`.
    """
    body = await request.body()
    params = parse_snapshot(body, body_format(request) if body else None)
    info = await engine.take_snapshot(params.tables)
    return encode(asdict(info), msgpack_body=msgpack_out, status_code=201)


@router.get(
    "",
    response_model=None,
    responses=answers(
        {200: (SnapshotList, "The complete snapshots, newest first.")},
        NotConfigured,
        *V1_ERRORS,
    ),
)
async def list_snapshots(engine: EngineDep, msgpack_out: AcceptsMsgpack) -> Response:
    """List the complete snapshots at the backup URL, newest first."""
    snapshots = await engine.list_snapshots()
    return encode({"snapshots": [asdict(s) for s in snapshots]}, msgpack_body=msgpack_out)
