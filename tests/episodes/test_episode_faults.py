"""Episode tables under a failing log: an append whose flush fails answers an error and
leaves nothing of it visible, now or after a restart; the same append then works."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlreplay.app.log.segments as segments_module
from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.wire.errors import StorageFull


def steps(start: int, k: int) -> dict[str, np.ndarray]:
    return {"obs": np.arange(start, start + k, dtype=np.int64).reshape(k, 1)}


async def test_an_append_whose_flush_fails_leaves_nothing_and_a_retry_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(data_dir=tmp_path / "data", io_threads=2, wal_writer="thread")
    eng = Engine(settings)
    await eng.start()
    try:
        await eng.create_table("eps", TableConfig(episodes={}))
        await eng.episodes.append("eps", "a", start=0, steps=steps(0, 3), wait=True)
        real = segments_module._pwrite_all

        def failing(*args: Any) -> None:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

        monkeypatch.setattr(segments_module, "_pwrite_all", failing)
        with pytest.raises(StorageFull):
            await eng.episodes.append("eps", "a", start=3, steps=steps(3, 2))
        with pytest.raises(StorageFull):
            await eng.episodes.append("eps", "b", start=0, steps=steps(0, 4))
        monkeypatch.setattr(segments_module, "_pwrite_all", real)

        got = await eng.episodes.read("eps", "a")
        assert got.length == 3
        stats = eng.describe("eps")["stats"]
        assert (stats["size"], stats["steps"], stats["episodes"]) == (3, 3, 1)
        # the same appends again: numbered as if the refused ones never were
        await eng.episodes.append("eps", "a", start=3, steps=steps(3, 2), wait=True)
        await eng.episodes.append("eps", "b", start=0, steps=steps(0, 4), wait=True)
        got = await eng.episodes.read("eps", "a")
        np.testing.assert_array_equal(got.steps["obs"], steps(0, 5)["obs"])
    finally:
        await eng.stop()
    eng = Engine(settings)
    await eng.start()
    try:
        a = await eng.episodes.read("eps", "a")
        b = await eng.episodes.read("eps", "b")
        assert (a.length, b.length) == (5, 4)
        np.testing.assert_array_equal(b.steps["obs"], steps(0, 4)["obs"])
    finally:
        await eng.stop()


async def crash(eng: Engine) -> None:
    """Stop ``eng`` as kill -9 leaves it: no final checkpoint, the log replayed at start."""
    assert eng._processor is not None
    await eng._processor.stop()
    await eng.stop()


async def test_uniform_trimming_is_replayed_identically(tmp_path: Path) -> None:
    """Episodes removed at random by a full table are the same after the log is replayed
    from a checkpoint (with a fresh writer and its own random generator)."""
    settings = Settings(data_dir=tmp_path / "data", io_threads=2, wal_writer="thread")
    config = TableConfig(episodes={}, max_size=24, remover={"type": "uniform"})
    eng = Engine(settings)
    await eng.start()
    try:
        await eng.create_table("eps", config)
        for n in range(60):
            end = "terminated" if n % 3 else None  # a third stay open
            await eng.episodes.append("eps", f"e{n}", start=0, steps=steps(0, 3), end=end)
            if n == 20:
                await eng.flush()  # the replay starts here, past some trims
        await eng.episodes.read("eps", "e59")  # every append applied
        e = eng.core.table("eps").episodes
        assert e is not None
        before = sorted(e.names)
        assert e.steps <= 24
    finally:
        await crash(eng)
    for _ in range(2):  # twice: the second start replays what the first did not cut
        eng = Engine(settings)
        await eng.start()
        try:
            e = eng.core.table("eps").episodes
            assert e is not None
            assert sorted(e.names) == before
        finally:
            await crash(eng)
