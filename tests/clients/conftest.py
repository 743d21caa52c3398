"""Fixtures of the client tests: a fake server behind ``httpx.MockTransport``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from rlreplay.clients import ReplayClient
from tests.clients.replay_fake import FakeServer


@pytest.fixture
def fake() -> FakeServer:
    return FakeServer()


@pytest.fixture
async def client(fake: FakeServer) -> AsyncIterator[ReplayClient]:
    async with ReplayClient(
        "http://replay.test",
        transport=httpx.MockTransport(fake),
        backoff_s=0.001,
        max_backoff_s=0.002,
    ) as rb:
        yield rb
