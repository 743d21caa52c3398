"""A log segment cut short, and the whole log folder removed, after ``kill -9``: the start
refuses, naming the damage, where it used to start ready with answered items missing. A
segment keeps its size through a crash (it is sized before records go into it) and the data
dir is marked while the log holds records no checkpoint covers, so neither fault looks like
a log that ends there, or one that was never needed."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.log.in_use import IN_USE
from rlreplay.app.log.segments import SEGMENT_BYTES
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from tests.faults.damaged_data import (
    MODES,
    PHASES,
    PUSHES,
    assert_everything_back,
    data_dir,
    refused,
    remove,
    segments,
    settings,
    started,
    value_of,
    values,
)


async def _killed_copy(data: Path, copy: Path, mode: str) -> dict[str, bytes]:
    """Push as :func:`~tests.faults.damaged_data.populate` does, then copy the data dir
    while the engine still runs (what ``kill -9`` leaves on disk: nothing closed, no file
    cut to its length), then stop it. Returns every answered item."""
    eng = Engine(settings(data, mode))
    await eng.start()
    answered: dict[str, bytes] = {}
    try:
        await eng.create_table("t", TableConfig())
        for phase in range(PHASES):
            if phase:
                await eng.flush()
            for i in range(PUSHES):
                key = f"p{phase}-{i}"
                await eng.push("t", [NewItem(key, value_of(key), 1.0)])
                answered[key] = value_of(key)
        shutil.copytree(data, copy, ignore=shutil.ignore_patterns("LOCK"))
    finally:
        await eng.stop()
    return answered


def _cut(path: Path, size: int) -> None:
    with path.open("r+b") as f:
        f.truncate(size)


@pytest.mark.parametrize("mode", MODES)
def test_a_newest_segment_cut_short_after_a_kill_refuses_the_start(
    tmp_path: Path, mode: str
) -> None:
    async def run() -> None:
        copy = tmp_path / "copy"
        answered = await _killed_copy(tmp_path / "data", copy, mode)
        newest = segments(copy)[-1]
        assert newest.stat().st_size >= SEGMENT_BYTES  # sized before its records went in
        _cut(newest, 5000)
        refusal = await refused(copy, mode)
        assert refusal.kind == "log_damaged"
        assert newest.name in str(refusal) and "cut short" in str(refusal)
        assert "5000 bytes" in str(refusal) and "--accept-data-loss" in str(refusal)
        eng = await started(copy, mode, accept_data_loss=True)
        try:
            got = await values(eng, list(answered))
            assert got["p0-0"] == answered["p0-0"]  # what the checkpoint holds is back
            assert eng.storage_stats()["data_lost"]
        finally:
            await eng.stop()

    asyncio.run(run())


@pytest.mark.parametrize("mode", MODES)
def test_a_segment_cut_short_after_its_close_refuses_the_start(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, mode: str
) -> None:
    data, _ = data_dir(tmp_path_factory, tmp_path, mode, "kill")
    newest = segments(data)[-1]
    _cut(newest, 5000)

    async def run() -> None:
        refusal = await refused(data, mode)
        assert refusal.kind == "log_damaged"
        assert newest.name in str(refusal) and "cut short" in str(refusal)

    asyncio.run(run())


@pytest.mark.parametrize("mode", MODES)
def test_a_kill_with_segments_at_their_full_size_loses_nothing(tmp_path: Path, mode: str) -> None:
    async def run() -> None:
        copy = tmp_path / "copy"
        answered = await _killed_copy(tmp_path / "data", copy, mode)
        assert (copy / IN_USE).exists()
        await assert_everything_back(copy, mode, answered)

    asyncio.run(run())


@pytest.mark.parametrize("mode", MODES)
def test_the_log_folder_removed_after_a_kill_refuses_the_start(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, mode: str
) -> None:
    data, _ = data_dir(tmp_path_factory, tmp_path, mode, "kill")
    remove(data / "wal")

    async def run() -> None:
        refusal = await refused(data, mode)
        assert refusal.kind == "log_missing"
        assert str(data / "wal") in str(refusal) and IN_USE in str(refusal)
        assert "--accept-data-loss" in str(refusal)
        eng = await started(data, mode, accept_data_loss=True)
        await eng.stop()
        assert os.listdir(data / "wal")  # the log goes on, with a manifest

    asyncio.run(run())


@pytest.mark.parametrize("mode", MODES)
def test_the_log_folder_removed_after_a_clean_stop_loses_nothing(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, mode: str
) -> None:
    data, answered = data_dir(tmp_path_factory, tmp_path, mode, "clean")
    assert not (data / IN_USE).exists()
    remove(data / "wal")
    asyncio.run(assert_everything_back(data, mode, answered))
