"""A window sample with no eligible start waits for the writer's next op, not a poll."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI

from rlreplay.app.engine import windows as engine_windows
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.wire.errors import DeadlineExceeded
from rlreplay.wire.window_schemas import WindowSampleRequest
from tests.api.conftest import app

__all__ = ["app"]  # the in-process app's fixture


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", storage_mode="memory")


async def append(app: FastAPI, episode: str, start: int, k: int, end: str | None = None) -> None:
    steps = {"obs": np.arange(start, start + k, dtype=np.float32), "reward": np.ones(k)}
    await app.state.engine.episodes.append(
        "w", episode, start=start, steps=steps, end=end, wait=True
    )


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a sample looked for eligible starts."""
    calls: list[int] = []
    real = engine_windows.eligible_starts

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_windows, "eligible_starts", counted)
    return calls


async def test_no_window_waits_without_polling_then_answers_504(
    app: FastAPI, looks: list[int]
) -> None:
    await app.state.engine.create_table("w", TableConfig.model_validate({"episodes": {}}))
    await append(app, "a", 0, 3)
    request = WindowSampleRequest(batch_size=2, length=5, timeout_ms=300)
    with pytest.raises(DeadlineExceeded, match="longest episode holds 3"):
        await app.state.engine.windows.sample("w", request)
    assert len(looks) == 1  # nothing was applied meanwhile: it looked once


async def test_a_waiting_sample_wakes_when_an_append_makes_a_window(
    app: FastAPI, looks: list[int]
) -> None:
    await app.state.engine.create_table("w", TableConfig.model_validate({"episodes": {}}))
    await append(app, "a", 0, 3)
    request = WindowSampleRequest(batch_size=4, length=5, timeout_ms=60_000)
    waiting = asyncio.create_task(app.state.engine.windows.sample("w", request))
    for _ in range(100):  # until it looked once and waits
        if looks:
            break
        await asyncio.sleep(0.01)
    assert looks and not waiting.done()
    await append(app, "a", 3, 1)  # still 4 steps: no window of 5
    await append(app, "a", 4, 2)
    sample = await asyncio.wait_for(waiting, 30)
    assert set(sample.starts.tolist()) <= {0, 1}
    assert len(looks) <= 3  # once at first, once per op applied after
