"""The write-ahead log: framing, group commit, torn tails, rotation and truncation."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.engine.wal import WriteAheadLog
from app.storage.blocking import BlockingIO


@pytest.fixture
def io() -> Iterator[BlockingIO]:
    pool = BlockingIO(threads=2)
    yield pool
    pool.close()


def reopen(folder: Path, io: BlockingIO, after: int = 0) -> list[list[object]]:
    return list(WriteAheadLog(folder, io=io).replay(after))


async def test_records_come_back_in_order_after_commit(tmp_path: Path, io: BlockingIO) -> None:
    wal = WriteAheadLog(tmp_path, io=io)
    list(wal.replay(0))
    wal.open(0)
    lsns = [wal.append(["put", "t", [f"k{i}"], [b"v" * i]]) for i in range(50)]
    await asyncio.gather(*(wal.commit(lsn) for lsn in lsns))  # one fsync serves them all
    wal.close()
    records = reopen(tmp_path, io)
    assert [r[0] for r in records] == lsns
    assert records[7] == [lsns[7], "put", "t", ["k7"], [b"v" * 7]]
    assert [r[0] for r in reopen(tmp_path, io, after=lsns[40])] == lsns[41:]


@pytest.mark.parametrize("cut", [1, 5, 9, 30])
async def test_a_torn_tail_ends_replay_at_the_last_whole_record(
    tmp_path: Path, io: BlockingIO, cut: int
) -> None:
    wal = WriteAheadLog(tmp_path, io=io)
    list(wal.replay(0))
    wal.open(0)
    for i in range(3):
        await wal.commit(wal.append(["del", "t", [f"k{i}" * 10]]))
    wal.close()
    (segment,) = tmp_path.glob("*.log")
    data = segment.read_bytes()
    segment.write_bytes(data[:-cut])  # a crash in the middle of the last record
    assert [r[0] for r in reopen(tmp_path, io)] == [1, 2]


async def test_a_corrupt_record_is_not_applied(tmp_path: Path, io: BlockingIO) -> None:
    wal = WriteAheadLog(tmp_path, io=io)
    list(wal.replay(0))
    wal.open(0)
    for i in range(3):
        await wal.commit(wal.append(["del", "t", [f"key-{i}"]]))
    wal.close()
    (segment,) = tmp_path.glob("*.log")
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0xFF  # flip bits inside the last payload: its CRC no longer matches
    segment.write_bytes(bytes(data))
    assert [r[0] for r in reopen(tmp_path, io)] == [1, 2]


async def test_rotate_and_truncate_drop_only_covered_segments(
    tmp_path: Path, io: BlockingIO
) -> None:
    wal = WriteAheadLog(tmp_path, io=io)
    list(wal.replay(0))
    wal.open(0)
    first = [wal.append(["del", "t", ["a"]]) for _ in range(3)]
    await wal.rotate()
    second = [wal.append(["del", "t", ["b"]]) for _ in range(3)]
    await wal.rotate()
    await wal.truncate(first[-1])  # covers the first segment only
    await wal.sync()
    wal.close()
    assert len(list(tmp_path.glob("*.log"))) == 2
    assert [r[0] for r in reopen(tmp_path, io)] == second
