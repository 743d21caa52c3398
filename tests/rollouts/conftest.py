"""Fixtures of the rollout-table tests: a live ``rlreplay serve`` and a client of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from rlreplay.clients import ReplayClient
from tests.live import running_server


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("rollouts")) as server:
        yield server.url


@pytest.fixture
async def rb(server_url: str) -> AsyncIterator[ReplayClient]:
    async with ReplayClient(server_url, backoff_s=0.01, max_backoff_s=0.05) as client:
        yield client


@pytest.fixture
def table(request: pytest.FixtureRequest) -> str:
    """A table name of the test's own."""
    name = request.node.name.replace("[", "_").replace("]", "").replace("-", "_")
    return "r_" + name[-100:]
