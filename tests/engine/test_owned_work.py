"""The engine owns its background work and changes nothing process-wide.

The field-learning scan that the first claim naming ``fields`` starts belongs to the claims
part's ``FieldLearning``: a table drop cancels it, and so does the engine's stop. And an
Engine created and started in a process (a test, a notebook) leaves glibc's malloc alone:
only ``rlreplay serve`` tunes it (glibc cannot read its settings back, so its entry points
are watched).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.engine.field_learning import FieldLearning
from rlreplay.app.storage import allocator as app_allocator
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.wire import allocator as wire_allocator
from rlreplay.wire.errors import TableNotFound
from tests.engine.conftest import make_settings


async def _blocked_scan(monkeypatch: pytest.MonkeyPatch, eng: Engine) -> asyncio.Future[None]:
    """A table ``t`` with items, whose field-learning scan never ends unless cancelled;
    returns the future the scan waits on."""
    await eng.create_table("t", TableConfig())
    await eng.push("t", [NewItem(f"k{i}", msgpack.packb({"reward": i}), 1.0) for i in range(4)])
    forever: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def scan(self: FieldLearning, t: Any) -> None:
        await forever

    monkeypatch.setattr(FieldLearning, "_learn", scan)
    return forever


async def _scan_of(eng: Engine, claim: asyncio.Task[Any]) -> asyncio.Task[None]:
    table = eng.state.tables["t"]
    for _ in range(1000):
        if table.rollouts.learning is not None:
            break
        await asyncio.sleep(0.01)
    learning = table.rollouts.learning
    assert isinstance(learning, asyncio.Task) and not learning.done() and not claim.done()
    return learning


async def test_a_table_drop_cancels_its_field_learning_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(make_settings(tmp_path / "d", storage_mode="memory"))
    await eng.start()
    try:
        await _blocked_scan(monkeypatch, eng)
        claim = asyncio.ensure_future(eng.claim("t", "trainer", 1, fields=["reward"], wait_ms=0))
        learning = await _scan_of(eng, claim)
        await eng.drop_table("t")
        await asyncio.wait({learning, claim}, timeout=30)
        assert learning.cancelled()
        assert claim.done()  # the claim waiting for the scan ends with it
        with pytest.raises((asyncio.CancelledError, TableNotFound)):
            claim.result()
    finally:
        await eng.stop()


async def test_the_engine_stop_cancels_a_field_learning_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(make_settings(tmp_path / "d", storage_mode="memory"))
    await eng.start()
    try:
        await _blocked_scan(monkeypatch, eng)
        claim = asyncio.ensure_future(eng.claim("t", "trainer", 1, fields=["reward"], wait_ms=0))
        learning = await _scan_of(eng, claim)
    finally:
        await eng.stop()
    assert learning.cancelled()
    await asyncio.wait({claim}, timeout=30)
    assert claim.done()


async def test_starting_an_engine_leaves_the_process_malloc_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(app_allocator, "glibc", lambda: calls.append("glibc"))
    monkeypatch.setattr(app_allocator, "raise_malloc_thresholds", lambda: calls.append("raise"))
    monkeypatch.setattr(wire_allocator, "raise_malloc_thresholds", lambda: calls.append("raise"))
    eng = Engine(make_settings(tmp_path / "d", storage_mode="memory"))
    await eng.start()
    try:
        await eng.create_table("t", TableConfig())
        await eng.push("t", [NewItem("k", msgpack.packb(1), 1.0)], wait=True)
    finally:
        await eng.stop()
    assert calls == []


def test_the_serve_command_tunes_malloc(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rlreplay serve`` makes the call, before its app exists."""
    import uvicorn

    from rlreplay.app import cli, main
    from rlreplay.app.api import connections, logs

    order: list[str] = []
    monkeypatch.setattr(logs, "configure_logging", lambda level: None)
    monkeypatch.setattr(connections, "raise_descriptor_limit", lambda n: None)
    monkeypatch.setattr(app_allocator, "tune_allocator", lambda: order.append("tune") or True)

    def no_app(*args: Any, **kwargs: Any) -> Any:
        order.append("app")
        raise RuntimeError("stop here")

    monkeypatch.setattr(main, "create_app", no_app)
    monkeypatch.setattr(uvicorn, "Config", no_app)
    settings = make_settings(Path("/nonexistent-never-created"), storage_mode="memory")
    with pytest.raises(RuntimeError, match="stop here"):
        cli._serve(settings)
    assert order == ["tune", "app"]
