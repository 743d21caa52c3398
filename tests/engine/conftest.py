"""Engine fixtures: an engine on a temporary data directory, in each storage mode."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings for a test engine: small queues and an explicit data directory."""
    base: dict[str, Any] = {"data_dir": data_dir, "io_threads": 2}
    base.update(overrides)
    return Settings(**base)


async def crash(eng: Engine) -> None:
    """Stop ``eng`` as ``kill -9`` leaves it: no final checkpoint, so the next start loads
    what the last checkpoint wrote and replays the log past it (answered writes are in the
    log already)."""
    processor = eng._processor
    assert processor is not None
    await processor.stop()  # the writer is gone: stop() then takes no checkpoint
    await eng.stop()


def item(key: str, value: Any = None, priority: float = 1.0) -> NewItem:
    """A NewItem whose value is the msgpack encoding of ``value`` (default: the key)."""
    return NewItem(key, msgpack.packb(key if value is None else value), priority)


@pytest.fixture
def settings_factory(tmp_path: Path) -> Callable[..., Settings]:
    def factory(**overrides: Any) -> Settings:
        return make_settings(tmp_path / "data", **overrides)

    return factory


@asynccontextmanager
async def engine_with_table(settings: Settings) -> AsyncIterator[Engine]:
    """A started engine with an uncapped table ``t``, stopped on exit."""
    eng = Engine(settings)
    await eng.start()
    await eng.create_table("t", TableConfig())
    try:
        yield eng
    finally:
        await eng.stop()


@pytest.fixture(params=["memory", "disk", "hybrid"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Engine]:
    settings = make_settings(
        tmp_path / "data",
        storage_mode=request.param,
        cache_memory_limit_mb=0.05 if request.param == "hybrid" else 64,
    )
    async with engine_with_table(settings) as eng:
        yield eng
