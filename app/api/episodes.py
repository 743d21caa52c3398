"""``/v1/tables/{table}/episodes/{episode}``: append steps to an episode, read and delete
it (episode tables; see the contract's "Episode tables").

An append's ``steps`` map is read where it lies in a msgpack body (arrays are extension
type 1) and logged as sent; in JSON, arrays come in the contract's ``{"$ndarray": ...}``
form, and plain lists of numbers are taken as NumPy makes them. A read answers the steps as
arrays: extension type 1 in msgpack, ``{"$ndarray": ...}`` in JSON.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import msgpack
import msgspec
from fastapi import APIRouter, Path, Query, Request, Response

from rlreplay.app.api.bodies import schema_refusal
from rlreplay.app.api.deps import TableName, engine_of, serve_body
from rlreplay.app.api.encoding import (
    JSON,
    MSGPACK,
    BodyFormat,
    Reply,
    dump_json,
    encode_reply,
    wants_msgpack,
)
from rlreplay.app.api.openapi import BODY_ERRORS, V1_ERRORS, answers, request_body
from rlreplay.app.api.write_status import status_of
from rlreplay.app.engine.engine import Engine
from rlreplay.app.engine.episodes import EpisodeRead
from rlreplay.app.episodes.step_arrays import (
    StepArrays,
    ext_of,
    steps_from_msgpack,
    steps_from_values,
)
from rlreplay.app.metrics import Metrics
from rlreplay.app.writer.request_ids import answer_count
from rlreplay.wire.codec import from_jsonable, msgpack_to_jsonable
from rlreplay.wire.episode_schemas import EpisodeAnswer, EpisodeStepsRequest
from rlreplay.wire.errors import (
    BadRequest,
    DeadlineExceeded,
    ItemNotFound,
    Overloaded,
    StepConflict,
    StorageFull,
    TableNotFound,
)
from rlreplay.wire.schemas import Accepted, PushCommitted

__all__ = ["append_steps_reply", "router"]

router = APIRouter(prefix="/v1/tables/{table}/episodes", tags=["episodes"])

EpisodeName = Annotated[
    str,
    Path(
        min_length=1,
        max_length=512,
        description="The episode's name (1 to 512 bytes of UTF-8), percent-encoded.",
        examples=["ep-7"],
    ),
]

_NULLS = (b"\xc0", b"null")  # a final of null, in msgpack or JSON
_DECODERS: dict[BodyFormat, Any] = {
    BodyFormat.MSGPACK: msgspec.msgpack.Decoder(EpisodeStepsRequest),
    BodyFormat.JSON: msgspec.json.Decoder(EpisodeStepsRequest),
}


@router.post(
    "/{episode}/steps",
    status_code=202,
    response_model=None,
    openapi_extra=request_body(EpisodeStepsRequest),
    responses=answers(
        {
            202: (Accepted, "Accepted: every later read sees the steps."),
            200: (PushCommitted, "With `wait: true`: the writer applied them."),
        },
        TableNotFound,
        StepConflict,
        Overloaded,
        StorageFull,
        DeadlineExceeded,
        *BODY_ERRORS,
        *V1_ERRORS,
    ),
)
async def append_steps(request: Request, table: TableName, episode: EpisodeName) -> Response:
    """Append steps to an episode, numbered from `start`.

    `start` must be the number of steps the episode holds (0 for a new one); a retry of
    steps stored with the same bytes is answered as accepted and changes nothing, any other
    `start` is 409 `step_conflict` (its message gives the episode's length), as is an
    append to an ended episode. `end` closes the episode after these steps, with its
    `final` values. Answers 202 `{"accepted": k}` once durable, or with `wait: true` 200
    `{"committed": k}` once applied.
    """

    async def handler(
        engine: Engine, metrics: Metrics, name: str, body: bytes, fmt: BodyFormat, out: bool
    ) -> Reply:
        return await append_steps_reply(engine, metrics, name, episode, body, fmt, out)

    return await serve_body(request, table, handler)


async def append_steps_reply(
    engine: Engine,
    metrics: Metrics,
    table: str,
    episode: str,
    body: bytes,
    fmt: BodyFormat,
    as_msgpack: bool,
) -> Reply:
    """The work of :func:`append_steps`."""
    if not body:
        raise BadRequest("the request body is empty")
    try:
        req: EpisodeStepsRequest = _DECODERS[fmt].decode(body)
    except msgspec.ValidationError as exc:
        raise schema_refusal(exc) from None
    except (msgspec.DecodeError, ValueError, RecursionError) as exc:
        raise BadRequest(f"malformed {fmt.value} body: {exc}") from exc
    steps, dtypes = _steps(req.steps, fmt)
    end = final = None
    if isinstance(req.end, msgspec.Struct):
        end = req.end.reason
        if isinstance(req.end.final, msgspec.Raw) and bytes(req.end.final) not in _NULLS:
            final = _final(req.end.final, fmt)
    answer = await engine.episodes.append(
        table,
        episode,
        start=req.start,
        steps=steps,
        dtypes=dtypes,
        priorities=None if req.priorities is msgspec.UNSET else req.priorities,
        end=end,
        final=final,
        wait=req.wait,
        request_id=None if req.request_id is msgspec.UNSET else req.request_id,
        blob=memoryview(req.steps) if fmt is BodyFormat.MSGPACK else None,
    )
    metrics.count_items("push", answer_count(answer))
    return encode_reply(answer, msgpack_body=as_msgpack, status=status_of(answer))


def _steps(raw: msgspec.Raw, fmt: BodyFormat) -> StepArrays:
    if fmt is BodyFormat.MSGPACK:
        return steps_from_msgpack(raw)
    try:
        values = from_jsonable(json.loads(bytes(raw)))
    except ValueError as exc:
        raise BadRequest(f"steps: {exc}") from exc
    if not isinstance(values, dict):
        raise BadRequest("steps must be a map of field name to array")
    return steps_from_values(values)


def _final(raw: msgspec.Raw, fmt: BodyFormat) -> dict[str, Any]:
    if fmt is BodyFormat.MSGPACK:
        arrays, _ = steps_from_msgpack(raw)
        return dict(arrays)
    try:
        values = from_jsonable(json.loads(bytes(raw)))
    except ValueError as exc:
        raise BadRequest(f"end.final: {exc}") from exc
    if not isinstance(values, dict):
        raise BadRequest("end.final must be a map of field name to value")
    return values


@router.get(
    "/{episode}",
    response_model=None,
    responses=answers(
        {200: (EpisodeAnswer, "The episode's steps [start, stop).")},
        TableNotFound,
        ItemNotFound,
        *V1_ERRORS,
    ),
)
async def get_episode(
    request: Request,
    table: TableName,
    episode: EpisodeName,
    start: Annotated[int | None, Query(ge=0, description="The first step (default 0).")] = None,
    stop: Annotated[
        int | None, Query(ge=0, description="Past the last step (default all).")
    ] = None,
) -> Response:
    """Read an episode's steps from start up to stop, clamped to those it holds.

    Answers `{"episode", "length", "end", "steps": {field: array}, "final"?}`; 404
    `item_not_found` when the table holds no such episode.
    """
    read = await engine_of(request).episodes.read(table, episode, start, stop)
    return episode_reply(read, as_msgpack=wants_msgpack(request)).response()


def episode_reply(read: EpisodeRead, *, as_msgpack: bool) -> Reply:
    """The answer of a read: arrays as extension type 1, or their JSON form."""
    body: dict[str, Any] = {
        "episode": read.episode,
        "length": read.length,
        "end": read.end,
        "start": read.start,
        "steps": {f: ext_of(a, read.dtypes.get(f)) for f, a in read.steps.items()},
    }
    if read.final:
        body["final"] = {f: ext_of(a, read.dtypes.get(f)) for f, a in read.final.items()}
    packed: bytes = msgpack.packb(body)
    if as_msgpack:
        return Reply(packed, MSGPACK)
    return Reply(dump_json(msgpack_to_jsonable(packed)), JSON)


@router.delete(
    "/{episode}",
    status_code=202,
    response_model=None,
    responses=answers(
        {202: (Accepted, "Accepted: later reads no longer see it.")}, TableNotFound, *V1_ERRORS
    ),
)
async def delete_episode(request: Request, table: TableName, episode: EpisodeName) -> Response:
    """Delete an episode and its steps (a missing one is no change)."""
    answer = await engine_of(request).episodes.delete(table, episode)
    reply = encode_reply(answer, msgpack_body=wants_msgpack(request), status=status_of(answer))
    return reply.response()
