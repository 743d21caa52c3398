"""Dependencies of the routes, as ``Annotated`` aliases.

The engine, settings and metrics live on ``app.state`` (put there by
:func:`app.main.create_app`); routes ask for them with these aliases.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from app.api.encoding import wants_msgpack
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
]

#: Table names: 1 to 128 letters, digits, ``_``, ``-`` and ``.``, starting with a letter or digit.
TABLE_NAME_PATTERN = TABLE_NAME.pattern


def get_engine(request: Request) -> Engine:
    """The app's engine."""
    engine: Engine = request.app.state.engine
    return engine


def get_settings(request: Request) -> Settings:
    """The app's settings."""
    settings: Settings = request.app.state.settings
    return settings


def get_metrics(request: Request) -> Metrics:
    """The app's metrics."""
    metrics: Metrics = request.app.state.metrics
    return metrics


EngineDep = Annotated[Engine, Depends(get_engine)]
AppSettings = Annotated[Settings, Depends(get_settings)]
AppMetrics = Annotated[Metrics, Depends(get_metrics)]
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
