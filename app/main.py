"""The app factory: ``create_app(settings)`` builds the FastAPI app around one engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI

from rlreplay.app import package_version
from rlreplay.app.api import (
    changes,
    episodes,
    health,
    items,
    reservations,
    rollouts,
    sampling,
    snapshots,
    tables,
)
from rlreplay.app.api.compression import ZstdCoding
from rlreplay.app.api.docs import install_docs
from rlreplay.app.api.errors import install_error_handlers
from rlreplay.app.api.hot import HotRoutes, ReplayApp
from rlreplay.app.api.logs import AccessLog
from rlreplay.app.api.middleware import RequestContextMiddleware
from rlreplay.app.api.openapi import build_openapi, summaries_from_docstrings
from rlreplay.app.engine.engine import Engine
from rlreplay.app.engine.snapshots import RestoreRefused
from rlreplay.app.log.framing import LogRecoveryError
from rlreplay.app.metrics import Metrics
from rlreplay.app.settings import Settings
from rlreplay.app.storage.allocator import tune_gc
from rlreplay.app.storage.faults import StorageDamaged
from rlreplay.app.tables.config import SamplerSpec, TableConfig

__all__ = ["DEFAULT_TABLE", "create_app"]

DEFAULT_TABLE = "default"

_log = logging.getLogger("rlreplay")

_DESCRIPTION = """\
An experience replay service for reinforcement learning.

* Bodies are `application/json` or `application/msgpack`; answers are msgpack when `Accept`
  names it, JSON otherwise. Item values are stored as the msgpack bytes sent.
* Over JSON, bytes are `{"$bytes": "<base64>"}`, arrays
  `{"$ndarray": {"dtype", "shape", "data": "<base64>"}}`, and the floats JSON cannot spell
  `{"$float": "NaN"}`, `{"$float": "Infinity"}` and `{"$float": "-Infinity"}`, in answers
  and in requests alike.
* Every error is `{"error": {"code", "message"}}`.
* With API keys configured, `/v1` needs `Authorization: Bearer <key>` (and `/metrics` too
  with `--metrics-require-key`).
"""


#: The documentation's groups of operations, in the order they are shown.
_TAGS = [
    {"name": "tables", "description": "Create, list, describe and drop tables."},
    {"name": "items", "description": "Push, read and delete items; update priorities."},
    {"name": "sampling", "description": "Draw batches with the table's sampler."},
    {
        "name": "rollouts",
        "description": "Rollout tables: fields patched by many tasks, claims under leases, "
        "acknowledgements, policy versions.",
    },
    {
        "name": "episodes",
        "description": "Episode tables: steps appended per episode, read and deleted.",
    },
    {"name": "snapshots", "description": "Snapshots to the backup URL, and the list of them."},
    {"name": "followers", "description": "A table's change feed and index (the GPU sidecar)."},
    {"name": "operations", "description": "Liveness, readiness and Prometheus metrics."},
]


def default_table_config(settings: Settings) -> TableConfig:
    """The config of the ``default`` table, from the settings."""
    return TableConfig.model_validate(
        {
            "sampler": SamplerSpec(type=settings.default_sampler),
            "max_size": settings.default_table_max_size,
        }
    )


def create_app(
    settings: Settings,
    *,
    engine: Engine | None = None,
    hot_routes: bool = True,
    tune_gc_after_start: bool = False,
    recover_in_background: bool = False,
    on_recovery_failure: Callable[[BaseException], None] | None = None,
    access_log: AccessLog | None = None,
) -> FastAPI:
    """Builds the service's app.

    The app's lifespan starts the engine (recovery included, and the ``default`` table
    when the settings ask for it) and stops it on shutdown (draining the writer and
    flushing).

    Args:
        settings: The service's settings.
        engine: The engine to serve; a new one built from ``settings`` when None (tests
            pass their own).
        hot_routes: Serve the data routes through :mod:`rlreplay.app.api.hot` (the fast path);
            False sends every request through FastAPI (tests compare the two).
        tune_gc_after_start: Freeze the objects alive once the engine started and raise the
            collector's threshold (:func:`rlreplay.app.storage.allocator.tune_gc`); ``rlreplay
            serve`` does, as the process is the service's own.
        recover_in_background: Start the engine in a task, so the server answers while it
            recovers (``rlreplay serve`` does): ``/healthz`` is 200 at once, ``/readyz`` and
            every ``/v1`` call 503 ``unavailable`` until recovery is done. Shutdown cancels
            a recovery still running (the next start recovers again) before stopping the
            engine. False: the lifespan's
            start-up returns once the engine is ready (tests, embedding).
        on_recovery_failure: Called with the error when a background recovery fails (after
            it is logged); ``rlreplay serve`` stops the server, which exits with status 3.
        access_log: Where request lines are written, in batches; the app owns it from here
            and its lifespan closes it (writing what waits). Through the ``rlreplay.access``
            logger when None.

    Returns:
        The ASGI app.
    """
    the_engine = engine if engine is not None else Engine(settings)
    metrics = Metrics(cache_s=settings.metrics_cache_s)
    metrics.watch_engine(the_engine, max_tables=settings.metrics_max_tables)

    async def recover() -> None:
        tables = {DEFAULT_TABLE: default_table_config(settings)} if settings.default_table else {}
        await the_engine.start(tables)
        if tune_gc_after_start:
            tune_gc(freeze=True)

    def recovered(task: asyncio.Task[None]) -> None:
        exc = None if task.cancelled() else task.exception()
        if exc is None:
            return
        if isinstance(exc, (RestoreRefused, StorageDamaged, LogRecoveryError)):  # says it all
            _log.critical("recovery failed: %s", exc)
        else:
            _log.critical("recovery failed: %r", exc, exc_info=exc)
        if on_recovery_failure is not None:
            on_recovery_failure(exc)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            async with serving(app):
                yield
        finally:
            if access_log is not None:
                access_log.close()

    @asynccontextmanager
    async def serving(_: FastAPI) -> AsyncIterator[None]:
        if not recover_in_background:
            try:
                await recover()
                yield
            finally:
                await the_engine.stop()
            return
        recovery = asyncio.create_task(recover(), name="rlreplay-recovery")
        recovery.add_done_callback(recovered)
        try:
            yield
        finally:
            if not recovery.done():  # SIGTERM while recovering: recovery stops where it is
                _log.info("shutting down: stopping the recovery first")
                recovery.cancel()
                await asyncio.wait({recovery})
            await the_engine.stop()

    app = ReplayApp(
        title="rlreplay",
        version=package_version(),
        description=_DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        separate_input_output_schemas=False,
        openapi_tags=_TAGS,
    )
    app.state.settings = settings
    app.state.engine = the_engine
    app.state.metrics = metrics
    install_error_handlers(app)
    # Routes match in the order included, and each included router costs its routes'
    # matching on every request that passes it by: the hot data routes come first. The
    # documentation keeps its own order (``openapi_tags``).
    for router in (
        sampling.router,
        items.router,
        rollouts.router,
        reservations.router,
        episodes.router,
        tables.router,
        snapshots.router,
        changes.router,
        health.router,
    ):
        app.include_router(summaries_from_docstrings(router))
    install_docs(app)
    openapi: Any = partial(build_openapi, app)
    app.openapi = openapi  # type: ignore[method-assign]
    context: dict[str, Any] = {
        "metrics": metrics,
        "max_body_bytes": int(settings.max_request_mb * 1024 * 1024),
        "api_keys": settings.api_key,
        "metrics_require_key": settings.metrics_require_key,
        "access_log": access_log,
    }
    coding: dict[str, Any] = {
        "max_body_bytes": context["max_body_bytes"],
        "offload": lambda fn, *args: the_engine.core.state.io.run(fn, *args),
    }
    if settings.zstd:  # inside the context middleware: its limit checks the bytes sent
        app.add_middleware(ZstdCoding, **coding)
    app.add_middleware(RequestContextMiddleware, **context)
    if hot_routes:
        hot = HotRoutes(the_engine, metrics)
        inner: Any = ZstdCoding(hot, **coding) if settings.zstd else hot
        app.serve_hot_routes(hot, RequestContextMiddleware(inner, **context))
    return app
