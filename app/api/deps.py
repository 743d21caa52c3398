"""Dependencies of the routes, as ``Annotated`` aliases, and the accessors behind them.

The engine, settings and metrics live on ``rlreplay.app.state`` (put there by
:func:`rlreplay.app.main.create_app`). Routes ask for them with these aliases, except the hot data
routes (push, sample, reads, deletes: :mod:`rlreplay.app.api.items`,
:mod:`rlreplay.app.api.sampling`), which
take the ``Request`` and call :func:`engine_of`, :func:`metrics_of` and
:func:`rlreplay.app.api.encoding.wants_msgpack` themselves: FastAPI's resolver costs several
microseconds per ``Depends`` per request, a tenth of a small request's whole time.

The dependencies are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in a
worker thread, a thread hop per dependency per request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Path, Request, Response

from rlreplay.app.api.encoding import BodyFormat, Reply, read_body
from rlreplay.app.api.encoding import wants_msgpack as _wants_msgpack
from rlreplay.app.engine.engine import TABLE_NAME, Engine
from rlreplay.app.metrics import Metrics
from rlreplay.app.settings import Settings

__all__ = [
    "TABLE_NAME_PATTERN",
    "AcceptsMsgpack",
    "AppMetrics",
    "AppSettings",
    "BodyHandler",
    "EngineDep",
    "ItemKey",
    "TableName",
    "engine_of",
    "metrics_of",
    "serve_body",
]

#: Table names: 1 to 128 letters, digits, ``_``, ``-`` and ``.``, starting with a letter or digit.
TABLE_NAME_PATTERN = TABLE_NAME.pattern


def engine_of(request: Request) -> Engine:
    """The engine of the request's app."""
    engine: Engine = request.app.state.engine
    return engine


def metrics_of(request: Request) -> Metrics:
    """The metrics of the request's app."""
    metrics: Metrics = request.app.state.metrics
    return metrics


#: A data route's work from the raw body on: ``(engine, metrics, table, body, body format,
#: msgpack answer?) -> Reply``. FastAPI's routes run it through :func:`serve_body`, the hot
#: path (:mod:`rlreplay.app.api.hot`) straight from the ASGI scope.
BodyHandler = Callable[[Engine, Metrics, str, bytes, BodyFormat, bool], Awaitable[Reply]]


async def serve_body(request: Request, table: str, handler: BodyHandler) -> Response:
    """Runs ``handler`` on the request's body (its format checked first) and answers."""
    body, fmt = await read_body(request)
    reply = await handler(
        engine_of(request), metrics_of(request), table, body, fmt, _wants_msgpack(request)
    )
    return reply.response()


async def get_engine(request: Request) -> Engine:
    """The app's engine."""
    return engine_of(request)


async def get_settings(request: Request) -> Settings:
    """The app's settings."""
    settings: Settings = request.app.state.settings
    return settings


async def get_metrics(request: Request) -> Metrics:
    """The app's metrics."""
    return metrics_of(request)


EngineDep = Annotated[Engine, Depends(get_engine)]
AppSettings = Annotated[Settings, Depends(get_settings)]
AppMetrics = Annotated[Metrics, Depends(get_metrics)]


async def wants_msgpack(request: Request) -> bool:
    """Whether the answer should be msgpack (the ``Accept`` header names it)."""
    return _wants_msgpack(request)


AcceptsMsgpack = Annotated[bool, Depends(wants_msgpack)]
TableName = Annotated[
    str,
    Path(
        pattern=TABLE_NAME_PATTERN,
        description="1 to 128 of `A-Z a-z 0-9 _ - .`, starting with a letter or digit.",
        examples=["default"],
    ),
]
ItemKey = Annotated[
    str,
    Path(
        min_length=1,
        max_length=512,
        description="The item's key (1 to 512 bytes of UTF-8), percent-encoded; `/` is allowed.",
        examples=["episode-17/step-3"],
    ),
]
