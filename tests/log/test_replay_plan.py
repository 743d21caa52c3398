"""Replay in two passes: a plan that checks the whole log and counts its records before any
is read back, then the records a bounded batch at a time."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlreplay.app.log import segment_reader
from rlreplay.app.log.segment_reader import WINDOW
from rlreplay.app.log.wal import SEGMENT_SUFFIX, LogRecoveryError, WriteAheadLog
from rlreplay.workers.blocking import BlockingIO


@pytest.fixture
def io() -> Iterator[BlockingIO]:
    pool = BlockingIO(threads=2)
    yield pool
    pool.close()


async def _three_segments(folder: Path, io: BlockingIO) -> list[list[object]]:
    """A log of three segments, one record in the second longer than a read window;
    returns the record bodies, LSN i + 1 at index i."""
    wal = WriteAheadLog(folder, io=io, writer="thread")
    assert list(wal.replay(0)) == []
    wal.open(0)
    bodies: list[list[object]] = []
    for segment in range(3):
        for i in range(40):
            blob = bytes([i]) * (WINDOW + 1000 if (segment, i) == (1, 7) else 3000)
            body: list[object] = ["put", "t", [f"k{segment}-{i}"], [blob]]
            bodies.append(body)
            await wal.commit(wal.append(body))
        await wal.rotate()
    wal.close()
    assert len(list(folder.glob(f"*{SEGMENT_SUFFIX}"))) >= 3
    return bodies


async def test_the_plan_counts_what_its_batches_give_back(tmp_path: Path, io: BlockingIO) -> None:
    bodies = await _three_segments(tmp_path, io)
    after = 25  # within the first segment: its first records are checkpointed
    wal = WriteAheadLog(tmp_path, io=io)
    try:
        plan = wal.replay_plan(after)
        assert plan.count == len(bodies) - after
        assert plan.last == len(bodies)
        batches = list(plan.batches(max_bytes=20_000, max_records=4))
    finally:
        wal.close()
    assert all(len(batch) <= 4 for batch in batches)
    assert len(batches[0]) == 4
    # the long record takes its batch past max_bytes: it ends that batch
    (holding,) = [b for b in batches if any(len(r[4][0]) > WINDOW for r in b)]
    assert len(holding[-1][4][0]) > WINDOW
    records = [record for batch in batches for record in batch]
    assert [r[0] for r in records] == list(range(after + 1, len(bodies) + 1))
    assert [r[1:] for r in records] == bodies[after:]
    assert wal.next_lsn == len(bodies) + 1


async def test_a_damaged_log_is_refused_before_any_record_is_read_back(
    tmp_path: Path, io: BlockingIO
) -> None:
    """Recovery applies nothing from a log it then refuses: the plan finds the damage."""
    await _three_segments(tmp_path, io)
    newest = sorted(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))[-2]  # holds the last records
    data = bytearray(newest.read_bytes())
    data[4096 + 100] ^= 0xFF  # its first record, whole records after it
    newest.write_bytes(bytes(data))
    wal = WriteAheadLog(tmp_path, io=io)
    try:
        with pytest.raises(LogRecoveryError, match="is damaged at bytes"):
            wal.replay_plan(0)
    finally:
        wal.close()


async def test_a_read_error_names_the_segment(
    tmp_path: Path, io: BlockingIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _three_segments(tmp_path, io)
    real_pread = os.pread
    second = sorted(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))[1]
    failing = os.open(second, os.O_RDONLY)  # its inode: the one whose reads fail
    inode = os.fstat(failing).st_ino
    os.close(failing)

    def pread(fd: int, n: int, pos: int) -> Any:
        if os.fstat(fd).st_ino == inode and pos > 4096:
            raise OSError(errno.EIO, "Input/output error")
        return real_pread(fd, n, pos)

    monkeypatch.setattr(segment_reader.os, "pread", pread)
    wal = WriteAheadLog(tmp_path, io=io)
    try:
        with pytest.raises(OSError, match="Input/output error") as failure:
            wal.replay_plan(0)
    finally:
        wal.close()
    assert failure.value.errno == errno.EIO and second.name in str(failure.value)
