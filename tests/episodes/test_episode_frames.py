"""Atari-sized frames in an episode table: 200,000 steps of 84x84 uint8 frames sampled
as stacks of 4 hold at most a quarter of their raw bytes with zstd, and each frame is
stored once (measured from the table's stats)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig

FRAME = 84 * 84
STEP_BYTES = FRAME + 1 + 4  # obs, action (uint8), reward (float32)


def frames(t0: int, n: int) -> dict[str, np.ndarray]:
    """Steps ``[t0, t0 + n)``: a 6x6 sprite moving over a constant background, as Atari
    frames go (compressible, every frame different)."""
    t = np.arange(t0, t0 + n)
    obs = np.full((n, 84, 84), 17, dtype=np.uint8)
    ys, xs = (t * 3) % 78, (t * 7) % 78
    rows = ys[:, None, None] + np.arange(6)[None, :, None]
    cols = xs[:, None, None] + np.arange(6)[None, None, :]
    obs[np.arange(n)[:, None, None], rows, cols] = 200
    return {
        "obs": obs,
        "action": (t % 4).astype(np.uint8),
        "reward": (t % 50 == 0).astype(np.float32),
    }


async def fill(eng: Engine, episodes: int, length: int, batch: int) -> dict[str, int]:
    for n in range(episodes):
        for lo in range(0, length, batch):
            end = "truncated" if lo + batch >= length else None
            await eng.episodes.append(
                "eps", f"e{n}", start=lo, steps=frames(n * length + lo, batch), end=end, wait=True
            )
    await eng.episodes.read("eps", f"e{episodes - 1}", 0, 1)  # every append applied
    stats: dict[str, int] = eng.describe("eps")["stats"]
    return stats


@pytest.mark.slow
async def test_200k_frames_hold_a_quarter_of_their_raw_bytes(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", storage_mode="memory", durability="none")
    config = TableConfig(episodes={"compression": "zstd", "frame_stack": {"obs": 4}})
    eng = Engine(settings)
    await eng.start()
    try:
        await eng.create_table("eps", config)
        stats = await fill(eng, episodes=40, length=5000, batch=1000)
        assert stats["steps"] == 200_000
        raw = 200_000 * STEP_BYTES  # each frame once; stacks of 4 would be 4x that
        assert stats["stored_bytes"] <= raw // 4, (stats["stored_bytes"], raw)
        # the frames read back whole, in stacks of 4 the first frame repeated before a start
        got = await eng.episodes.read("eps", "e7", 4990, 5000)
        np.testing.assert_array_equal(got.steps["obs"], frames(7 * 5000 + 4990, 10)["obs"])
    finally:
        await eng.stop()


async def test_each_frame_is_stored_once(tmp_path: Path) -> None:
    """Uncompressed, the table holds exactly one copy of each step's fields: steps x frame
    bytes, not x k."""
    settings = Settings(data_dir=tmp_path / "data", storage_mode="memory", durability="none")
    config = TableConfig(episodes={"compression": "none", "frame_stack": {"obs": 4}})
    eng = Engine(settings)
    await eng.start()
    try:
        await eng.create_table("eps", config)
        stats = await fill(eng, episodes=3, length=1000, batch=250)
        assert stats["stored_bytes"] == 3000 * STEP_BYTES
    finally:
        await eng.stop()
