"""An episode table's change feed: one event per step, keyed ``<episode>@<step>`` (a
window start): appends put, deletes and trims delete, window priorities change."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig


def steps(k: int) -> dict[str, np.ndarray]:
    return {"obs": np.zeros((k, 2), dtype=np.float32)}


async def test_the_change_feed_carries_each_step(tmp_path: Path) -> None:
    eng = Engine(Settings(data_dir=tmp_path / "data", storage_mode="memory"))
    await eng.start()
    try:
        await eng.create_table("eps", TableConfig(episodes={}, max_size=6))
        feed = eng.core.table("eps").follow(1000)
        await eng.episodes.append("eps", "a", start=0, steps=steps(2), priorities=[0.5, 2.0])
        await eng.episodes.append("eps", "a", start=2, steps=steps(1), end="terminated")
        await eng.episodes.set_window_priorities("eps", [("a", 1, 3.0), ("gone", 0, 1.0)])
        await eng.episodes.append("eps", "b", start=0, steps=steps(4), wait=True)  # trims "a"
        await eng.episodes.delete("eps", "b", wait=True)
        got = [(ev.op, ev.key, ev.priority) for ev in feed.events(0, 100)]
        assert got == [
            ("put", "a@0", 0.5),
            ("put", "a@1", 2.0),
            ("put", "a@2", 2.0),  # by default the largest priority held
            ("priority", "a@1", 3.0),
            *[("put", f"b@{i}", 3.0) for i in range(4)],
            *[("delete", f"a@{i}", None) for i in range(3)],
            *[("delete", f"b@{i}", None) for i in range(4)],
        ]
    finally:
        await eng.stop()
