"""Fixtures of the sidecar tests: an in-process server and a client of it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from rlreplay.app.main import create_app
from rlreplay.app.settings import Settings
from rlreplay.clients import ReplayClient

torch = pytest.importorskip("torch")  # the gpu extra; the service's tests run without it


@pytest.fixture
async def rb(tmp_path: Path) -> AsyncIterator[ReplayClient]:
    """A client of an in-process server (memory mode, a small change ring)."""
    settings = Settings(
        data_dir=tmp_path / "data", storage_mode="memory", durability="none", changes_keep=64
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with ReplayClient("http://testserver", transport=transport) as client:
            yield client
