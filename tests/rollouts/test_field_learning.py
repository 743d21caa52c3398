"""Pushes record which fields their values have only once a claim asked for fields: the
first such claim learns the fields of the items pushed before it (from the cache, or from
RocksDB for values evicted or written through), in every storage mode, and a restart keeps
what was learned or learns it again."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from tests.engine.conftest import crash, make_settings

MODES = [
    {"storage_mode": "memory"},
    {"storage_mode": "hybrid", "cache_memory_limit_mb": 0.002},  # values evicted to RocksDB
    {"storage_mode": "disk"},
]


def rollout(i: int) -> NewItem:
    value: dict[str, object] = {"prompt": i, "pad": "x" * 200}
    if i % 2:
        value["reward"] = float(i)
    return NewItem(f"r{i:03d}", msgpack.packb(value), 1.0)


async def claimed_keys(eng: Engine, task: str, fields: list[str]) -> list[str]:
    lease, items = await eng.claim(
        "t", task, 1000, fields=fields, wait_ms=0, partial=True, lease_s=600
    )
    assert lease is not None
    return [item.key for item in items]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m["storage_mode"])
async def test_the_first_claim_for_fields_learns_them(
    tmp_path: Path, mode: dict[str, object]
) -> None:
    settings = make_settings(tmp_path / "d", **mode)
    eng = Engine(settings)
    await eng.start()
    try:
        await eng.create_table("t", TableConfig())
        for start in range(0, 60, 6):
            await eng.push("t", [rollout(i) for i in range(start, start + 6)])
        await eng.flush()
        table = eng.state.tables["t"]
        assert not table.field_mask[: len(table.keys)].any()  # nobody asked: nothing read
        with_reward = [f"r{i:03d}" for i in range(60) if i % 2]
        assert await claimed_keys(eng, "trainer", ["reward"]) == with_reward
        # learned: pushes record their fields from now on, and a patch gives one
        await eng.push("t", [rollout(i) for i in range(60, 64)])
        await eng.patch("t", [("r000", msgpack.packb({"reward": 0.0}))])
        assert await claimed_keys(eng, "trainer", ["reward"]) == ["r000", "r061", "r063"]
        assert await claimed_keys(eng, "ref", ["prompt", "reward"]) == [
            "r000",
            *with_reward,
            "r061",
            "r063",
        ]
        await eng.flush()
        await eng.push("t", [rollout(i) for i in range(64, 68)])
    finally:
        await crash(eng)
    eng = Engine(settings)
    await eng.start()
    try:  # a new task sees every item with a reward, oldest first
        expected = ["r000", *with_reward, *(f"r{i:03d}" for i in range(60, 68) if i % 2)]
        assert await claimed_keys(eng, "critic", ["reward"]) == expected
    finally:
        await eng.stop()
