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
