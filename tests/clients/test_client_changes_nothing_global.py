"""Creating, using and closing a ReplayClient changes nothing outside it: it calls none of
the process-wide malloc tuning, and patches no class of httpx or httpcore.

glibc offers no way to read its malloc thresholds back, and a process's imports move its
dynamic ones, so the tuning is watched at its only entry points instead."""

from __future__ import annotations

from typing import Any

import httpcore
import httpx
import pytest

from rlreplay import ReplayClient
from rlreplay.wire import allocator
from tests.clients.replay_fake import FakeServer


def snapshot(cls: type) -> dict[str, Any]:
    return {name: value for name, value in vars(cls).items() if not name.startswith("__")}


@pytest.mark.parametrize(
    ("url", "lean_transport"),
    [
        ("http://127.0.0.1:9", True),  # the client's own transport
        ("http://127.0.0.1:9", False),  # httpx's, on httpcore
        ("https://127.0.0.1:9", True),  # https always goes through httpx's
    ],
)
async def test_a_client_calls_no_allocator_function_and_patches_no_class(
    monkeypatch: pytest.MonkeyPatch, url: str, lean_transport: bool
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(allocator, "raise_malloc_thresholds", lambda: calls.append("raise"))
    monkeypatch.setattr(allocator, "tune_malloc", lambda: calls.append("tune"))
    classes = [httpcore.AsyncHTTP11Connection, httpcore.AsyncConnectionPool, httpx.AsyncClient]
    before = [snapshot(cls) for cls in classes]
    async with ReplayClient(url, lean_transport=lean_transport):
        pass
    fake = FakeServer()
    async with ReplayClient("http://replay.test", transport=httpx.MockTransport(fake)) as rb:
        await rb.create_table("t")
        await rb.push("t", [{"key": "k", "value": 1}])
        assert (await rb.get("t", "k"))["value"] == 1
    assert calls == []
    assert [snapshot(cls) for cls in classes] == before
