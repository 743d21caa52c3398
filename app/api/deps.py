"""Dependencies of the routes, as ``Annotated`` aliases, and the accessors behind them.

The engine, settings and metrics live on ``app.state`` (put there by
:func:`app.main.create_app`). Routes ask for them with these aliases, except the hot data
routes (push, sample, reads, deletes: :mod:`app.api.items`, :mod:`app.api.sampling`), which
take the ``Request`` and call :func:`engine_of`, :func:`metrics_of` and
:func:`app.api.encoding.wants_msgpack` themselves: FastAPI's resolver costs several
microseconds per ``Depends`` per request, a tenth of a small request's whole time.

The dependencies are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in a
worker thread, a thread hop per dependency per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from app.api.encoding import wants_msgpack as _wants_msgpack
from app.engine.engine import TABLE_NAME, Engine
from app.metrics import Metrics
from app.settings import Settings

__all__ = [
    "TABLE_NAME_PATTERN",
    "AcceptsMsgpack",
    "AppMetrics",
    "AppSettings",
    "EngineDep",
    "ItemKey",
    "TableName",
    "engine_of",
    "metrics_of",
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
