"""As the server stops, ``Engine.end_waits`` answers every call held waiting for other
clients with ``Unavailable`` (503) at once, and one that would start such a wait too, while
calls that need no such wait are still served."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.engine.feed import read_changes
from rlreplay.app.tables.config import MinSizeLimiter, QueueLimiter, TableConfig
from rlreplay.wire.errors import Unavailable
from tests.engine.conftest import item, make_settings

HELD_S = 60  # what each held call asks to wait: far past the deadline below
ANSWERED_S = 30  # generous: a held call answers within this once its wait is ended


@pytest.fixture
async def eng(tmp_path: Path) -> AsyncIterator[Engine]:
    engine = Engine(make_settings(tmp_path / "data", storage_mode="memory"))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


Call = Callable[[], Awaitable[Any]]


async def _claim(eng: Engine) -> Call:
    await eng.create_table("t", TableConfig())
    return lambda: eng.claims.claim("t", "task", 1, wait_ms=HELD_S * 1000)


async def _sample_empty(eng: Engine) -> Call:
    await eng.create_table("t", TableConfig())
    return lambda: eng.sample_batch("t", 1, timeout_s=HELD_S)


async def _sample_rate_limited(eng: Engine) -> Call:
    limiter = MinSizeLimiter(type="min_size", min_size=5)
    await eng.create_table("t", TableConfig(rate_limiter=limiter))
    await eng.push("t", [item("a")], wait=True)
    return lambda: eng.sample_batch("t", 1, timeout_s=HELD_S)


async def _push_rate_limited(eng: Engine) -> Call:
    await eng.create_table("t", TableConfig(rate_limiter=QueueLimiter(type="queue", size=1)))
    await eng.push("t", [item("a")], wait=True)
    return lambda: eng.push("t", [item("b")], wait=True, timeout_s=HELD_S)


async def _reserve(eng: Engine) -> Call:
    await eng.create_table("t", TableConfig.model_validate({"admission": {"max_ahead": 1}}))
    await eng.reservations.reserve("t", 1, 0, wait_ms=0, ttl_s=600)
    return lambda: eng.reservations.reserve("t", 1, 0, wait_ms=HELD_S * 1000, ttl_s=600)


async def _changes(eng: Engine) -> Call:
    await eng.create_table("t", TableConfig())
    seq = (await read_changes(eng.core, "t", 0, 10, 0.0)).seq
    return lambda: read_changes(eng.core, "t", seq, 10, HELD_S)


#: Each makes a table where its call waits, and returns the call.
HELD: dict[str, Callable[[Engine], Awaitable[Call]]] = {
    "claim": _claim,
    "sample-of-an-empty-table": _sample_empty,
    "sample-the-limiter-holds": _sample_rate_limited,
    "push-the-limiter-holds": _push_rate_limited,
    "reservation": _reserve,
    "changes-long-poll": _changes,
}


async def _held(call: Call) -> asyncio.Task[Any]:
    """``call`` as a task, once it waits (it has not answered after the loop went idle)."""
    task = asyncio.ensure_future(call())
    for _ in range(50):
        await asyncio.sleep(0.01)
    assert not task.done(), task.result()
    return task


@pytest.mark.parametrize("held", sorted(HELD))
async def test_a_held_call_answers_unavailable_once_waits_end(eng: Engine, held: str) -> None:
    task = await _held(await HELD[held](eng))
    eng.end_waits()
    with pytest.raises(Unavailable, match="shutting down"):
        await asyncio.wait_for(task, ANSWERED_S)


@pytest.mark.parametrize("held", sorted(HELD))
async def test_a_wait_that_starts_after_the_end_answers_at_once(eng: Engine, held: str) -> None:
    call = await HELD[held](eng)
    eng.end_waits()
    with pytest.raises(Unavailable, match="shutting down"):
        await asyncio.wait_for(call(), ANSWERED_S)


async def test_a_table_created_after_the_end_holds_no_wait(eng: Engine) -> None:
    eng.end_waits()
    call = await _claim(eng)
    with pytest.raises(Unavailable, match="shutting down"):
        await asyncio.wait_for(call(), ANSWERED_S)


async def test_calls_that_need_no_wait_are_still_served(eng: Engine) -> None:
    await eng.create_table("t", TableConfig())
    since = (await read_changes(eng.core, "t", 0, 10, 0.0)).seq  # the feed starts
    await eng.push("t", [item("a"), item("b")], wait=True)
    eng.end_waits()
    await eng.push("t", [item("c")], wait=True)
    assert len((await eng.sample_batch("t", 2, timeout_s=HELD_S)).keys) == 2
    lease, items = await eng.claims.claim("t", "task", 3, wait_ms=HELD_S * 1000)
    assert lease is not None and len(items) == 3
    assert len((await read_changes(eng.core, "t", since, 10, HELD_S)).events) == 3


@pytest.mark.parametrize("held", sorted(HELD))
async def test_a_held_call_answers_unavailable_when_the_writer_dies(
    eng: Engine, held: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's death (a bug) ends every held wait, as docs/architecture.md promises,
    rather than leave claims and reservations waiting out their time."""
    task = await _held(await HELD[held](eng))

    async def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in the writer")

    await eng.create_table("u", TableConfig())
    monkeypatch.setattr(eng._processor, "apply", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        await eng.push("u", [item("z")], wait=True)
    with pytest.raises(Unavailable, match="writer"):
        await asyncio.wait_for(task, ANSWERED_S)
