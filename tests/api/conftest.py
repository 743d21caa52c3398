"""Fixtures of the HTTP tests: an in-process app over ``httpx.ASGITransport``, and real
``rlreplay serve`` subprocesses (:mod:`tests.live`) shared by a session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from rlreplay.app.main import create_app
from rlreplay.app.settings import Settings
from tests.live import LiveServer, running_server


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings of an in-process app: memory mode, a temp data dir, a 1 MiB request limit."""
    return Settings(data_dir=tmp_path / "data", storage_mode="memory", max_request_mb=1)


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    """The app with its lifespan running (engine started, ``default`` table created)."""
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client talking to the in-process app."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        yield c


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The main live server: hybrid storage, WAL, a 1 MiB request limit."""
    with running_server(tmp_path_factory.mktemp("live"), "--max-request-mb", "1") as server:
        yield server


@pytest.fixture(scope="session")
def live_keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A live server with two API keys, in memory mode."""
    with running_server(
        tmp_path_factory.mktemp("keys"),
        "--storage-mode",
        "memory",
        "--api-key",
        "key-one",
        "--api-key",
        "key-two",
    ) as server:
        yield server
