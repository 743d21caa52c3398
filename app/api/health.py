"""Operations: liveness, readiness and Prometheus metrics.

They stay open with API keys configured, except ``/metrics`` with ``--metrics-require-key``
(the check is :class:`rlreplay.app.api.middleware.RequestContextMiddleware`'s, as for ``/v1``).
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from rlreplay.app.api.deps import AcceptsMsgpack, AppMetrics, EngineDep
from rlreplay.app.api.encoding import encode
from rlreplay.app.api.openapi import answers
from rlreplay.app.engine.core import EngineCore
from rlreplay.app.metrics import CONTENT_TYPE
from rlreplay.wire.errors import Unauthorized, Unavailable
from rlreplay.wire.schemas import Health

__all__ = ["router"]

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    response_model=None,
    responses=answers({200: (Health, "Alive.")}, Unavailable),
)
async def healthz(engine: EngineDep, msgpack_out: AcceptsMsgpack) -> Response:
    """Liveness: 200 while the process makes progress, recovering too.

    503 once its writer has died, or storage found its files damaged, so that an orchestrator
    restarts it."""
    if not engine.alive:
        raise Unavailable(f"the writer died and cannot come back: {engine.writer_failure}")
    _refuse_damage(engine.core)
    return encode({"status": "ok"}, msgpack_body=msgpack_out)


def _refuse_damage(engine: EngineCore) -> None:
    """503 once RocksDB found a damaged file: writes to it can never succeed again."""
    damage = engine.storage_damage
    if damage is not None:
        raise Unavailable(
            f"storage is damaged, restart the server (its start refuses the file by name): {damage}"
        )


@router.get(
    "/readyz",
    response_model=None,
    responses=answers({200: (Health, "Ready.")}, Unavailable),
)
async def readyz(engine: EngineDep, msgpack_out: AcceptsMsgpack) -> Response:
    """Readiness: recovery and restore finished and the writer runs.

    503 until then, and once storage found its files damaged."""
    _refuse_damage(engine.core)
    if not engine.ready:
        raise Unavailable("not ready: recovery or restore in progress, or the writer stopped")
    return encode({"status": "ready"}, msgpack_body=msgpack_out)


@router.get(
    "/metrics",
    response_model=None,
    responses={
        200: {"description": "Prometheus text format.", "content": {CONTENT_TYPE: {}}},
        **answers({}, Unauthorized),
    },
)
async def metrics(metrics: AppMetrics) -> Response:
    """Prometheus metrics: requests, ops, tables and write queues.

    Totals over every table, and series of their own for the largest tables only (up to
    `--metrics-max-tables`, default 100). A rendering is reused for `--metrics-cache-s`
    (default 1 s). Open, unless `--metrics-require-key` is set and API keys are configured:
    then it needs `Authorization: Bearer <key>` like `/v1`.
    """
    return Response(metrics.render(), media_type=CONTENT_TYPE)
