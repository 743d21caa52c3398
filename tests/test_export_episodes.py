"""``rlreplay export`` of an episode table: one row per step, with ``episode`` and
``step`` columns, from a data directory and from a snapshot in each storage mode."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.export import export_snapshot, export_table
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig

LENGTHS = {"a": 700, "b": 3, "c": 1300}  # more than one read batch for "c"


def steps_of(name: str, n: int) -> dict[str, np.ndarray]:
    base = ord(name) * 10_000
    return {
        "obs": (np.arange(n * 6, dtype=np.float32) + base).reshape(n, 3, 2),
        "reward": np.arange(n, dtype=np.float32) / 4,
        "step": np.arange(n, dtype=np.int64) + base,  # a field named like a column
    }


def build(data_dir: Path, mode: str, url: str) -> None:
    async def run() -> None:
        settings = Settings(
            data_dir=data_dir, storage_mode=mode, backup_url=url, backup_interval_s=0
        )
        engine = Engine(settings)
        await engine.start()
        try:
            await engine.create_table("eps", TableConfig(episodes={"compression": "zstd"}))
            for name, n in LENGTHS.items():
                end = "terminated" if name != "c" else None
                await engine.episodes.append("eps", name, start=0, steps=steps_of(name, n), end=end)
            await engine.take_snapshot()
        finally:
            await engine.stop()

    asyncio.run(run())


def check_rows(rows: list[dict]) -> None:  # type: ignore[type-arg]
    assert len(rows) == sum(LENGTHS.values())
    at = 0
    for name, n in LENGTHS.items():
        want = steps_of(name, n)
        for i in range(n):
            row = rows[at + i]
            assert (row["episode"], row["step"]) == (name, i)
            np.testing.assert_array_equal(np.asarray(row["obs"]).reshape(3, 2), want["obs"][i])
            assert row["reward"] == want["reward"][i]
            assert row["steps.step"] == want["step"][i]
            assert row["priority"] == 1.0 and row["times_sampled"] == 0
            last = i == n - 1 and name != "c"
            assert row["end"] == ("terminated" if last else None)
        at += n


@pytest.mark.parametrize("mode", ["hybrid", "memory"])
def test_an_episode_table_exports_one_row_per_step(tmp_path: Path, mode: str) -> None:
    url = (tmp_path / "backups").as_uri()
    build(tmp_path / "data", mode, url)

    out = tmp_path / "eps.jsonl"
    assert export_snapshot(url, "eps", "jsonl", out) == sum(LENGTHS.values())
    check_rows([json.loads(line) for line in out.read_text().splitlines()])

    out = tmp_path / "eps.parquet"
    assert export_table(tmp_path / "data", "eps", "parquet", out, mode=mode) == 2003
    table = pq.read_table(out)
    assert table.schema.names[:5] == ["episode", "step", "priority", "times_sampled", "end"]
    check_rows(table.to_pylist())
