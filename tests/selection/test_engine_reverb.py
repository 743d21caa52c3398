"""Reverb's table recipes, end to end through the engine: queues, stacks, priority views.

These tests drive :class:`rlreplay.app.engine.engine.Engine` (memory mode) with the selectors and
rate limiters of this package, and check what a client of such a table relies on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.wire.errors import DeadlineExceeded

SHORT = 0.05


def item(key: str, value: Any = None, priority: float = 1.0) -> NewItem:
    return NewItem(key, msgpack.packb(key if value is None else value), priority)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    settings = Settings.model_validate(
        {"data_dir": tmp_path / "data", "storage_mode": "memory", "io_threads": 2}
    )
    eng = Engine(settings)
    await eng.start()
    try:
        yield eng
    finally:
        await eng.stop()


def config(**fields: Any) -> TableConfig:
    return TableConfig.model_validate(fields)


async def keys(engine: Engine, table: str, n: int) -> list[str]:
    return [b.key for b in await engine.sample(table, n, timeout_s=SHORT)]


async def test_queue_table_is_a_bounded_fifo_queue(engine: Engine) -> None:
    await engine.create_table(
        "q",
        config(
            sampler={"type": "fifo"},
            remover={"type": "fifo"},
            max_size=3,
            max_times_sampled=1,
            rate_limiter={"type": "queue", "size": 3},
        ),
    )
    await engine.push("q", [item("a"), item("b")])
    await engine.push("q", [item("c")])
    with pytest.raises(DeadlineExceeded):
        await engine.push("q", [item("d")], timeout_s=SHORT)  # full: nothing is lost
    assert await keys(engine, "q", 1) == ["a"]
    await engine.push("q", [item("d")], timeout_s=SHORT)
    assert await keys(engine, "q", 3) == ["b", "c", "d"]
    with pytest.raises(DeadlineExceeded):
        await engine.sample("q", 1, timeout_s=SHORT)  # empty


async def test_blocked_queue_consumer_is_served_by_the_next_push(engine: Engine) -> None:
    await engine.create_table(
        "q",
        config(
            sampler={"type": "fifo"}, max_times_sampled=1, rate_limiter={"type": "queue", "size": 4}
        ),
    )
    consumer = asyncio.create_task(engine.sample("q", 2, timeout_s=5))
    await asyncio.sleep(0.02)
    await engine.push("q", [item("x")])
    await asyncio.sleep(0.02)
    assert not consumer.done()  # one of two
    await engine.push("q", [item("y")])
    assert [b.key for b in await asyncio.wait_for(consumer, 2)] == ["x", "y"]


async def test_stack_table_hands_out_newest_first(engine: Engine) -> None:
    await engine.create_table(
        "s",
        config(
            sampler={"type": "lifo"},
            max_times_sampled=1,
            rate_limiter={"type": "queue", "size": 10},
        ),
    )
    await engine.push("s", [item(k) for k in "abc"])
    assert await keys(engine, "s", 2) == ["c", "b"]
    await engine.push("s", [item("d")])
    assert await keys(engine, "s", 2) == ["d", "a"]


async def test_fifo_with_max_times_sampled_hands_each_item_out_once_in_order(
    engine: Engine,
) -> None:
    await engine.create_table("f", config(sampler={"type": "fifo"}, max_times_sampled=1))
    await engine.push("f", [item(f"k{i:02}") for i in range(20)], wait=True)
    seen = await keys(engine, "f", 7) + await keys(engine, "f", 13)
    assert seen == [f"k{i:02}" for i in range(20)]


async def test_max_times_sampled_two_serves_each_twice(engine: Engine) -> None:
    await engine.create_table("f", config(sampler={"type": "fifo"}, max_times_sampled=2))
    await engine.push("f", [item("a"), item("b")])
    assert await keys(engine, "f", 4) == ["a", "a", "b", "b"]


async def test_sample_to_insert_ratio_paces_samples_by_inserts(engine: Engine) -> None:
    # 2 samples per insert, after 2 items; error_buffer 2: cursor in [2, 6].
    await engine.create_table(
        "r",
        config(
            rate_limiter={
                "type": "sample_to_insert_ratio",
                "min_size_to_sample": 2,
                "samples_per_insert": 2.0,
                "error_buffer": 2.0,
            }
        ),
    )
    await engine.push("r", [item("a")])
    with pytest.raises(DeadlineExceeded):
        await engine.sample("r", 1, timeout_s=SHORT)  # below min size
    await engine.push("r", [item("b")])  # cursor 4
    assert len(await engine.sample("r", 2, timeout_s=SHORT)) == 2  # cursor 2
    with pytest.raises(DeadlineExceeded):
        await engine.sample("r", 1, timeout_s=SHORT)
    await engine.push("r", [item("c"), item("d")])  # cursor 6
    with pytest.raises(DeadlineExceeded):
        await engine.push("r", [item("e")], timeout_s=SHORT)  # would make 8 > 6
    assert len(await engine.sample("r", 4, timeout_s=SHORT)) == 4


async def test_min_heap_remover_keeps_the_highest_priorities(engine: Engine) -> None:
    await engine.create_table(
        "top", config(sampler={"type": "max_heap"}, remover={"type": "min_heap"}, max_size=3)
    )
    priorities = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for i, p in enumerate(priorities):
        await engine.push("top", [item(f"k{i}", priority=p)], wait=True)
    got = await engine.get_many("top", [f"k{i}" for i in range(6)])
    assert [g.key for g in got if g is not None] == ["k0", "k2", "k4"]
    assert await keys(engine, "top", 1) == ["k2"]


async def test_prioritized_reports_probability_and_weight(engine: Engine) -> None:
    await engine.create_table(
        "p", config(sampler={"type": "prioritized", "exponent": 0.5, "is_exponent": 1.0})
    )
    priorities = {"a": 1.0, "b": 4.0, "c": 16.0, "z": 0.0}
    await engine.push("p", [item(k, priority=p) for k, p in priorities.items()], wait=True)
    batch = await engine.sample("p", 200, timeout_s=SHORT)
    masses = {k: p**0.5 for k, p in priorities.items()}  # 1, 2, 4, 0
    total = sum(masses.values())
    assert "z" not in {b.key for b in batch}
    raw = {b.key: (4 * masses[b.key] / total) ** -1.0 for b in batch}
    for b in batch:
        assert b.probability == pytest.approx(masses[b.key] / total, rel=1e-12)
        assert b.weight == pytest.approx(raw[b.key] / max(raw.values()), rel=1e-12)
    await engine.update_priorities("p", {"c": 0.0, "a": 0.0, "b": 0.0})
    batch = await engine.sample("p", 50, timeout_s=SHORT)  # all zero: uniform
    assert {b.probability for b in batch} == {0.25}


async def test_score_plugin_through_the_engine(engine: Engine) -> None:
    await engine.create_table("best", config(sampler={"type": "score"}, max_times_sampled=1))
    values: dict[str, Any] = {
        "low": {"score": 1.0},
        "none": {"obs": [1, 2]},
        "high": {"score": 8.5},
        "mid": {"score": 3, "obs": b"x"},
        "scalar": 42,
    }
    await engine.push("best", [item(k, v) for k, v in values.items()], wait=True)
    order = await keys(engine, "best", 5)
    assert order[:3] == ["high", "mid", "low"]
    assert sorted(order[3:]) == ["none", "scalar"]


async def test_ptime_prefers_recent_items(engine: Engine) -> None:
    await engine.create_table("t", config(sampler={"type": "ptime", "half_life_s": 1e-3}))
    await engine.push("t", [item("old")], wait=True)
    await asyncio.sleep(0.05)  # 50 half-lives
    await engine.push("t", [item("new")], wait=True)
    batch = await engine.sample("t", 100, timeout_s=SHORT)
    assert {b.key for b in batch} == {"new"}
    assert np.isclose(batch[0].probability, 1.0)
