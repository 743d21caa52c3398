"""kill -9 after long columnar pushes were answered under ``wal``: every one comes back bit
for bit (their bodies read straight into a pooled buffer, their blobs copied into the log
and hashed in steps)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlreplay.app.log.wal import HASH_WHILE_COPYING_BYTES
from rlreplay.clients import ReplayClient
from tests.live import start_server, stop_server

PUSHES = 6
ROWS = 3


def _columns(push: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(push)
    frame = HASH_WHILE_COPYING_BYTES // ROWS + 4099  # a column past the step, not a multiple
    return {
        "frames": rng.integers(0, 256, (ROWS, frame), np.uint8),
        "tokens": rng.integers(-(1 << 31), 1 << 31, (ROWS, 3001), np.int32),
        "logp": rng.standard_normal((ROWS, 3001)).astype(np.float32),
    }


async def test_long_pushes_answered_survive_kill_9(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--max-request-mb", "64")
    try:
        async with ReplayClient(server.url, timeout_s=60) as rb:
            await rb.create_table("t")
            for push in range(PUSHES):
                keys = [f"p{push}-{row}" for row in range(ROWS)]
                assert await rb.push_columns("t", keys, _columns(push)) == ROWS
        server.process.kill()  # no shutdown, no checkpoint: the log alone has them
        server.process.wait(15)
    finally:
        stop_server(server)
    server = start_server(tmp_path, "--max-request-mb", "64", data_dir=server.data_dir)
    try:
        async with ReplayClient(server.url, timeout_s=60) as rb:
            for push in range(PUSHES):
                keys = [f"p{push}-{row}" for row in range(ROWS)]
                got = await rb.get_many("t", keys)
                for row, item in enumerate(got):
                    assert item is not None, keys[row]
                    for field, column in _columns(push).items():
                        value = item["value"][field]
                        assert value.dtype == column.dtype
                        assert value.tobytes() == column[row].tobytes()
    finally:
        stop_server(server)
