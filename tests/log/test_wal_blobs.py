"""Records with a blob (a push's body): copied into the log's buffer and hashed in steps
when long, the same bytes on disk as when copied and hashed whole."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rlreplay.app.log import wal as wal_module
from rlreplay.app.log.wal import SEGMENT_SUFFIX, WriteAheadLog
from rlreplay.workers.blocking import BlockingIO


@pytest.fixture
def io() -> Iterator[BlockingIO]:
    pool = BlockingIO(threads=2)
    yield pool
    pool.close()


#: The length from which blobs are hashed in steps (read before a test changes it).
STEP = wal_module.HASH_WHILE_COPYING_BYTES


def _blobs() -> list[bytes | memoryview]:
    rng = np.random.default_rng(5)
    step = STEP
    tokens = rng.integers(0, 1 << 31, (3 * step + 1236) // 4, np.int32)
    return [
        rng.integers(0, 256, 1000, np.uint8).tobytes(),  # short: copied and hashed whole
        memoryview(tokens).cast("B"),  # a partial last step
        memoryview(rng.integers(0, 256, step, np.uint8).tobytes()),  # exactly one step
        rng.integers(0, 256, 2 * step + 7, np.uint8).tobytes(),
    ]


async def _log_blobs(folder: Path, io: BlockingIO) -> list[int]:
    wal = WriteAheadLog(folder, io=io)
    assert list(wal.replay(0)) == []
    wal.open(0)
    lsns = [wal.append(["push_body", "t", 1.5], blob) for blob in _blobs()]
    await asyncio.gather(*(wal.commit(lsn) for lsn in lsns))
    wal.close()
    return lsns


async def test_long_blobs_come_back_whole(tmp_path: Path, io: BlockingIO) -> None:
    lsns = await _log_blobs(tmp_path, io)
    wal = WriteAheadLog(tmp_path, io=io)
    try:
        records = list(wal.replay(0))  # every record's checksum is checked on the way
    finally:
        wal.close()
    assert [r[0] for r in records] == lsns
    for record, blob in zip(records, _blobs(), strict=True):
        assert record[1:4] == ["push_body", "t", 1.5]
        assert record[4] == bytes(blob)


async def test_hashing_in_steps_writes_the_bytes_hashing_whole_does(
    tmp_path: Path, io: BlockingIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _log_blobs(tmp_path / "steps", io)
    monkeypatch.setattr(wal_module, "HASH_WHILE_COPYING_BYTES", 1 << 62)
    await _log_blobs(tmp_path / "whole", io)
    (steps,) = (tmp_path / "steps").glob(f"*{SEGMENT_SUFFIX}")
    (whole,) = (tmp_path / "whole").glob(f"*{SEGMENT_SUFFIX}")
    assert steps.read_bytes() == whole.read_bytes()
