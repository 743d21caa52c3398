"""The write-ahead log: framing, group commit, torn tails, rotation and truncation."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from rlreplay.app.log import flushes, segments
from rlreplay.app.log import wal as wal_module
from rlreplay.app.log.segments import SEGMENT_BYTES
from rlreplay.app.log.wal import FRAME, SEGMENT_SUFFIX, LogRecoveryError, WriteAheadLog
from rlreplay.workers import log_writer_process as writer_process
from rlreplay.workers.blocking import BlockingIO


@pytest.fixture
def io() -> Iterator[BlockingIO]:
    pool = BlockingIO(threads=2)
    yield pool
    pool.close()


def reopen(folder: Path, io: BlockingIO, after: int = 0) -> list[list[object]]:
    wal = WriteAheadLog(folder, io=io)
    try:
        return list(wal.replay(after))
    finally:
        wal.close()  # gives the folder's lock back


BLOCK = 4096


def fresh(folder: Path, io: BlockingIO, **kwargs: Any) -> WriteAheadLog:
    """A log on an empty folder, opened for appending."""
    wal = WriteAheadLog(folder, io=io, **kwargs)
    assert list(wal.replay(0)) == []
    wal.open(0)
    return wal


def framed(body: list[Any], lsn: int) -> int:
    """Bytes the record ``body`` takes as a frame (header and payload) under ``lsn``."""
    return FRAME.size + len(msgpack.packb([lsn, *body], use_bin_type=True))


def blob_for(framed_size: int, lsn: int) -> list[Any]:
    """A record body whose frame under ``lsn`` is exactly ``framed_size`` bytes."""
    n = framed_size - framed(["b", b""], lsn)
    while framed(["b", b"x" * n], lsn) > framed_size:
        n -= 1
    body: list[Any] = ["b", b"x" * n]
    assert framed(body, lsn) == framed_size
    return body


def segment_of(folder: Path) -> Path:
    (segment,) = folder.glob(f"*{SEGMENT_SUFFIX}")
    return segment


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
    (segment,) = tmp_path.glob(f"*{SEGMENT_SUFFIX}")
    data = segment.read_bytes()
    end = len(data.rstrip(b"\0"))  # the last record's end: zero padding follows it
    # a crash in the middle of the last record (the file keeps its size: it was sized first)
    segment.write_bytes(data[: end - cut].ljust(len(data), b"\0"))
    assert [r[0] for r in reopen(tmp_path, io)] == [1, 2]


async def test_a_corrupt_record_is_not_applied(tmp_path: Path, io: BlockingIO) -> None:
    wal = WriteAheadLog(tmp_path, io=io)
    list(wal.replay(0))
    wal.open(0)
    for i in range(3):
        await wal.commit(wal.append(["del", "t", [f"key-{i}"]]))
    wal.close()
    (segment,) = tmp_path.glob(f"*{SEGMENT_SUFFIX}")
    data = bytearray(segment.read_bytes())
    end = len(data.rstrip(b"\0"))  # the last record's end: zero padding follows it
    data[end - 3] ^= 0xFF  # flip bits inside the last payload: its CRC no longer matches
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
    assert len(list(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))) == 2
    assert [r[0] for r in reopen(tmp_path, io, after=first[-1])] == second
    with pytest.raises(LogRecoveryError, match="records 1 to 3 are missing"):
        reopen(tmp_path, io)  # a checkpoint that covers less than the log was cut to


async def test_every_flush_writes_whole_blocks_ending_in_a_zero_frame_header(
    tmp_path: Path, io: BlockingIO
) -> None:
    wal = fresh(tmp_path, io)
    segment = segment_of(tmp_path)
    bodies = []
    for tail in [*range(BLOCK - 12, BLOCK + 12), 2 * BLOCK - 8, 2 * BLOCK - 7, 2 * BLOCK]:
        lsn = wal.next_lsn
        body = blob_for(tail, lsn)  # one record per flush: the frames are `tail` bytes
        bodies.append(body)
        before = wal._files.offset  # the file was sized before: its offset grows
        await wal.commit(wal.append(body))
        grown = wal._files.offset - before
        assert grown % BLOCK == 0
        assert grown - tail >= FRAME.size  # a zero header ends every region
        assert grown - tail < BLOCK + FRAME.size
    # several records of odd sizes in one flush
    lsns = [wal.append(["b", b"y" * (i * 997 % 5000 + 1)]) for i in range(40)]
    await asyncio.gather(*(wal.commit(lsn) for lsn in lsns))
    assert segment.stat().st_size % BLOCK == 0
    # the segment's header block, then the regions
    assert BLOCK + wal.bytes_since_checkpoint == wal._files.offset == wal.disk_bytes()
    wal.close()
    records = reopen(tmp_path, io)
    assert [r[0] for r in records] == list(range(1, len(bodies) + len(lsns) + 1))
    assert [r[1:] for r in records[: len(bodies)]] == bodies
    assert records[-1] == [lsns[-1], "b", b"y" * (39 * 997 % 5000 + 1)]


@pytest.mark.parametrize("fail_at", ["open", "write"])
async def test_the_buffered_fallback_writes_the_same_log(
    tmp_path: Path, io: BlockingIO, monkeypatch: pytest.MonkeyPatch, caplog: Any, fail_at: str
) -> None:
    bodies: list[list[Any]] = [["put", "t", [f"k{i}"], [b"v" * (i * 301)]] for i in range(30)]

    async def write(folder: Path, **kwargs: Any) -> WriteAheadLog:
        wal = fresh(folder, io, **kwargs)
        for i in range(0, len(bodies), 7):
            lsns = [wal.append(body) for body in bodies[i : i + 7]]
            await asyncio.gather(*(wal.commit(lsn) for lsn in lsns))
        await wal.rotate()
        await wal.commit(wal.append(["del", "t", ["k1"]]))
        return wal

    direct = await write(tmp_path / "direct")
    direct.close()
    buffered = await write(tmp_path / "buffered", direct=False)
    assert buffered._files.fd is not None
    assert not fcntl.fcntl(buffered._files.fd, fcntl.F_GETFL) & wal_module.O_DIRECT
    buffered.close()

    # a filesystem that refuses O_DIRECT, at open (tmpfs) or at the first write
    real_open, real_pwrite = os.open, os.pwrite
    direct_fds: set[int] = set()

    def refusing_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & wal_module.O_DIRECT and fail_at == "open":
            raise OSError(errno.EINVAL, "Invalid argument")
        fd = real_open(path, flags, *args, **kwargs)
        if flags & wal_module.O_DIRECT:
            direct_fds.add(fd)
        else:
            direct_fds.discard(fd)  # the number of a closed one, reused
        return fd

    def refusing_pwrite(fd: int, data: Any, offset: int) -> int:
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    names = ["direct", "buffered"]
    if wal_module.O_DIRECT:
        monkeypatch.setattr(os, "open", refusing_open)
        monkeypatch.setattr(os, "pwrite", refusing_pwrite)
        caplog.set_level(logging.INFO, logger="rlreplay.app.log.wal")
        refused = await write(tmp_path / "refused")
        assert refused._files.direct is False and refused._files.fd is not None
        assert not fcntl.fcntl(refused._files.fd, fcntl.F_GETFL) & wal_module.O_DIRECT
        refused.close()
        monkeypatch.undo()
        modes = [r.getMessage() for r in caplog.records if "write-ahead log in" in r.getMessage()]
        assert len(modes) == 1 and "buffered" in modes[0], modes
        names.append("refused")

    expected = [*bodies, ["del", "t", ["k1"]]]
    for name in names:
        assert [r[1:] for r in reopen(tmp_path / name, io)] == expected, name
        files = sorted((tmp_path / name).glob(f"*{SEGMENT_SUFFIX}"))
        assert [f.read_bytes() for f in files] == [
            f.read_bytes() for f in sorted((tmp_path / "direct").glob(f"*{SEGMENT_SUFFIX}"))
        ], name


async def test_the_log_uses_o_direct_where_the_filesystem_allows(
    tmp_path: Path, io: BlockingIO
) -> None:
    wal = fresh(tmp_path, io)
    await wal.commit(wal.append(["del", "t", ["a"]]))
    assert wal._files.fd is not None
    flags = fcntl.fcntl(wal._files.fd, fcntl.F_GETFL)
    assert wal._files.direct is (
        bool(flags & wal_module.O_DIRECT) if wal_module.O_DIRECT else False
    )
    wal.close()


async def three_flushes(folder: Path, io: BlockingIO) -> bytes:
    """Three records of about 1.5 blocks, one flush each; returns the segment's bytes."""
    wal = fresh(folder, io)
    for i in range(3):
        await wal.commit(wal.append(["put", "t", [f"k{i}"], [bytes([i + 1]) * 6000]]))
    wal.close()
    data = segment_of(folder).read_bytes()
    assert len(data) == BLOCK + 3 * 2 * BLOCK  # the header block, then the regions
    return data


@pytest.mark.parametrize(
    ("damage", "left"),
    [
        ("cut in the last record", [1, 2]),
        ("cut in the last padding", [1, 2, 3]),
        ("last record's second block never written", [1, 2]),
        ("last region never written", [1, 2]),
        ("middle region never written", [1]),
        ("garbage in padding", [1]),
        ("corrupt crc", [1]),
        ("a stale older region after the end", [1, 2, 3]),
    ],
)
async def test_damage_in_a_padded_log_ends_replay_at_the_last_whole_record(
    tmp_path: Path, io: BlockingIO, damage: str, left: list[int]
) -> None:
    data = bytearray(await three_flushes(tmp_path, io))
    first, last = BLOCK, 5 * BLOCK  # the first and third regions
    if damage == "cut in the last record":
        data[last + 5000 :] = bytes(len(data) - last - 5000)  # a torn tail keeps the size
    elif damage == "cut in the last padding":
        data[last + 7000 :] = bytes(len(data) - last - 7000)
    elif damage == "last record's second block never written":
        data[last + BLOCK :] = bytes(BLOCK)
    elif damage == "last region never written":
        data[last:] = bytes(2 * BLOCK)
    elif damage == "middle region never written":
        data[first + 2 * BLOCK : last] = bytes(2 * BLOCK)  # record 3 must not follow record 1
    elif damage == "garbage in padding":
        data[first + 2 * BLOCK - 100] = 1  # in the first region's padding
    elif damage == "corrupt crc":
        data[first + 2 * BLOCK + 4] ^= 0x01  # the second record's checksum
    else:
        data += data[first : first + 2 * BLOCK]  # the first region again (a failed flush)
    segment_of(tmp_path).write_bytes(bytes(data))
    assert [r[0] for r in reopen(tmp_path, io)] == left


def buffer_sizes(wal: WriteAheadLog) -> list[int]:
    """Sizes of the log's buffers, the fill one and the free ones."""
    fill = [] if wal._fill is None else [len(wal._fill)]
    return sorted(fill + [len(b) for b in wal._free])


async def test_a_flush_bigger_than_the_buffer_grows_it_and_rotation_gives_it_back(
    tmp_path: Path, io: BlockingIO
) -> None:
    small = wal_module._BUFFER_BYTES
    wal = fresh(tmp_path, io, writer="thread")
    await wal.commit(wal.append(["b", b"small"]))
    assert buffer_sizes(wal) == [small]
    big = [bytes([i]) * (1 << 20) for i in range(1, 7)]  # 6 MiB in one flush
    lsns = [wal.append(["b", value]) for value in big]
    assert wal._fill is not None and len(wal._fill) == 2 * small
    assert buffer_sizes(wal) == [small, 2 * small]  # the small one went back when it grew
    await asyncio.gather(*(wal.commit(lsn) for lsn in lsns))
    assert buffer_sizes(wal) == [small, 2 * small]
    assert segment_of(tmp_path).stat().st_size % BLOCK == 0
    await wal.rotate()  # the big flush was since the last rotation: kept
    assert buffer_sizes(wal) == [small, 2 * small]
    await wal.commit(wal.append(["b", b"small again"]))
    await wal.commit(wal.append(["b", b"and again"]))  # both buffers were used
    await wal.rotate()  # only small flushes since: given back, reallocated when needed
    assert buffer_sizes(wal) == [small]
    await wal.commit(wal.append(["b", b"last"]))
    wal.close()
    values = [r[2] for r in reopen(tmp_path, io)]
    assert values == [b"small", *big, b"small again", b"and again", b"last"]


async def test_appends_during_a_flush_go_to_another_buffer(tmp_path: Path, io: BlockingIO) -> None:
    wal = fresh(tmp_path, io, writer="thread")
    first = wal.append(["b", b"1" * 10_000])
    flush = asyncio.ensure_future(wal.commit(first))
    await asyncio.sleep(0)  # the flush has taken the fill buffer
    assert wal._flushing is not None and wal._fill is None
    later = [wal.append(["b", bytes([i]) * 7000]) for i in range(5)]  # while it writes
    await flush
    await asyncio.gather(*(wal.commit(lsn) for lsn in later))
    wal.close()
    assert [r[0] for r in reopen(tmp_path, io)] == [first, *later]
    assert [r[2] for r in reopen(tmp_path, io)][1:] == [bytes([i]) * 7000 for i in range(5)]


# -- the log writer process ---------------------------------------------------------------

needs_process = pytest.mark.skipif(
    not writer_process.SUPPORTED, reason="no memfd or descriptor passing on this platform"
)


async def _busy(wal: WriteAheadLog, rounds: int, tag: str) -> list[int]:
    """``rounds`` rounds of 8 concurrent appends and commits; returns the LSNs."""
    lsns: list[int] = []
    for r in range(rounds):
        batch = [wal.append(["put", "t", [f"{tag}{r}.{i}"], [bytes([i]) * 3000]]) for i in range(8)]
        lsns += batch
        await asyncio.gather(*(wal.commit(lsn) for lsn in batch))
    return lsns


@needs_process
async def test_the_log_writer_process_writes_what_the_thread_would(
    tmp_path: Path, io: BlockingIO
) -> None:
    wal = fresh(tmp_path, io, writer="process")
    lsns = await _busy(wal, 5, "a")
    assert wal._process.proc is not None  # after the first write (in the thread) settled O_DIRECT
    # many committers at once: several flushes in flight, the process joins their syncs
    many = [wal.append(["put", "t", [f"m{i}"], [b"m" * (i * 500)]]) for i in range(200)]
    waiters = []
    for lsn in many:
        waiters.append(asyncio.ensure_future(wal.commit(lsn)))
        if lsn % 7 == 0:
            await asyncio.sleep(0)
            assert len(wal._process.in_flight) <= wal_module.MAX_IN_FLIGHT
    await asyncio.gather(*waiters)
    await wal.rotate()
    lsns += many + await _busy(wal, 3, "b")
    await wal.truncate(lsns[len(lsns) // 2])
    await wal.drain()
    wal.close()
    assert wal._process.proc is None
    assert [r[0] for r in reopen(tmp_path, io)][-len(lsns) // 3 :] == lsns[-len(lsns) // 3 :]
    records = reopen(tmp_path, io)
    assert records[-1][4] == [bytes([7]) * 3000]
    assert all(f.stat().st_size % BLOCK == 0 for f in tmp_path.glob(f"*{SEGMENT_SUFFIX}"))


@needs_process
async def test_auto_starts_the_process_once_the_log_is_busy(
    tmp_path: Path, io: BlockingIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flushes, "PROCESS_AFTER_FLUSHES", 5)
    wal = fresh(tmp_path, io)
    await _busy(wal, 4, "a")
    assert wal._process.proc is None and wal._process.thread_flushes == 4
    lsns = await _busy(wal, 4, "b")
    assert wal._process.proc is not None and wal._process.thread_flushes == 5
    await wal.drain()
    wal.close()
    assert [r[0] for r in reopen(tmp_path, io)][-len(lsns) :] == lsns


@needs_process
async def test_a_failed_write_in_the_process_fails_its_waiters_and_a_new_segment_follows(
    tmp_path: Path, io: BlockingIO
) -> None:
    wal = fresh(tmp_path, io, writer="process")
    kept = await _busy(wal, 2, "a")
    assert wal._process.proc is not None
    writable = wal._files.fd
    assert writable is not None
    segment = segment_of(tmp_path)
    wal._files.fd = os.open(segment, os.O_RDONLY)  # the process gets a file it cannot write
    wal._files.segment_token = object()
    lost = wal.append(["del", "t", ["lost"]])
    with pytest.raises(OSError):
        await wal.commit(lost)
    assert wal._files.failed
    with pytest.raises(OSError):  # a later caller waiting for the same record hears it too
        await wal.commit(lost)
    after = await _busy(wal, 2, "b")  # the thread starts a new segment, then the process
    assert wal._process.proc is not None and not wal._files.failed
    await wal.drain()
    wal.close()
    os.close(writable)
    records = reopen(tmp_path, io)
    assert [r[0] for r in records] == [*kept, *after]
    assert len(list(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))) == 2


@needs_process
async def test_when_the_process_dies_the_thread_takes_over(tmp_path: Path, io: BlockingIO) -> None:
    wal = fresh(tmp_path, io, writer="process")
    kept = await _busy(wal, 2, "a")
    assert wal._process.proc is not None
    wal._process.proc.kill()
    maybe = wal.append(["del", "t", ["maybe"]])
    try:  # the request may reach the dead socket's buffer, or fail to send at once
        await wal.commit(maybe)
    except OSError:
        pass
    assert wal._process.proc is None and wal._process.writer == "thread"
    after = await _busy(wal, 2, "b")
    wal.close()
    got = [r[0] for r in reopen(tmp_path, io)]
    assert got in ([*kept, *after], [*kept, maybe, *after])


async def test_a_torn_segment_with_the_next_name_is_started_afresh(
    tmp_path: Path, io: BlockingIO
) -> None:
    wal = fresh(tmp_path, io)
    for i in range(3):
        await wal.commit(wal.append(["del", "t", [f"k{i}"]]))
    wal.close()
    # a crash right after a rotation, in the middle of the new segment's first write
    (tmp_path / "00000000000000000004.wal").write_bytes(FRAME.pack(50, 1234) + b"torn")
    wal = WriteAheadLog(tmp_path, io=io)
    assert [r[0] for r in wal.replay(0)] == [1, 2, 3]
    wal.open(0)
    await wal.commit(wal.append(["del", "t", ["k4"]]))
    await wal.rotate()
    await wal.truncate(3)  # drops the first segment only: the torn one was reused
    wal.close()
    assert [r[0] for r in reopen(tmp_path, io, after=3)] == [4]
    assert len(list(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))) == 2


@pytest.mark.parametrize("failing", ["pwrite", "fdatasync"])
async def test_after_a_failed_flush_the_log_goes_on_in_a_new_segment(
    tmp_path: Path, io: BlockingIO, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    wal = fresh(tmp_path, io)
    await wal.commit(wal.append(["del", "t", ["a"]]))

    def fail(*args: Any) -> Any:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, failing, fail)
    lost = wal.append(["del", "t", ["lost"]])
    with pytest.raises(OSError, match="Input/output") as failure:
        await wal.commit(lost)
    monkeypatch.undo()
    big = b"x" * (5 << 20)  # grows the buffer while the failure's traceback holds views of it
    await wal.commit(wal.append(["put", "t", ["b"], [big]]))
    del failure
    with pytest.raises(OSError, match="Input/output"):  # refused for good
        await wal.commit(lost)
    wal.close()
    names = sorted(p.name for p in tmp_path.glob(f"*{SEGMENT_SUFFIX}"))
    # the new segment is named after the first record not durable: the refused record,
    # which may have reached the first segment (fdatasync failed), is void there
    assert names == ["00000000000000000001.wal", "00000000000000000002.wal"]
    records = reopen(tmp_path, io)
    assert [r[0] for r in records] == [1, 3]
    assert records[-1][4] == [big]


async def test_after_a_failed_rotation_the_next_flush_opens_the_segment(
    tmp_path: Path, io: BlockingIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = fresh(tmp_path, io)
    await wal.commit(wal.append(["del", "t", ["a"]]))
    real_open = os.open

    def full_disk_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(SEGMENT_SUFFIX):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", full_disk_open)
    first = wal.append(["del", "t", ["b"]])
    with pytest.raises(OSError, match="No space"):
        await wal.rotate()  # b is written and synced; the new segment is not there
    monkeypatch.undo()
    second = wal.append(["del", "t", ["c"]])
    await wal.commit(second)
    await wal.rotate()
    wal.close()
    await wal.commit(first)  # b was written and synced before the rotation failed
    assert [r[0] for r in reopen(tmp_path, io)] == [1, first, second]
    assert len(list(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))) == 3


async def test_a_second_log_on_the_folder_waits_for_the_first(
    tmp_path: Path, io: BlockingIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segments, "LOCK_WAIT_S", 0.2)
    wal = fresh(tmp_path, io, writer="thread")
    await wal.commit(wal.append(["del", "t", ["a"]]))
    with pytest.raises(RuntimeError, match="in use by another process"):
        reopen(tmp_path, io)
    wal.close()
    assert [r[0] for r in reopen(tmp_path, io)] == [1]


@needs_process
async def test_the_log_writer_process_holds_the_lock_until_it_exits(
    tmp_path: Path, io: BlockingIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server killed with -9 leaves its log writer finishing a write: a new server must
    not replay (or reuse a segment name) before that process is gone."""
    monkeypatch.setattr(segments, "LOCK_WAIT_S", 0.2)
    wal = fresh(tmp_path, io, writer="process")
    lsns = await _busy(wal, 2, "a")
    assert wal._process.proc is not None and wal._files.lock_fd is not None
    os.close(wal._files.lock_fd)  # as if this process were gone: only the writer holds the lock
    wal._files.lock_fd = None
    with pytest.raises(RuntimeError, match="in use by another process"):
        reopen(tmp_path, io)
    await wal.drain()
    wal.close()  # the writer process exits
    assert [r[0] for r in reopen(tmp_path, io)] == lsns


async def _fill_and_checkpoint(wal: WriteAheadLog, tag: str, n: int) -> list[int]:
    """Commit ``n`` records of 20 KB, rotate, and truncate everything before the new segment."""
    lsns = [wal.append(["b", tag, os.urandom(20_000)]) for _ in range(n)]
    await wal.commit(lsns[-1])
    await wal.rotate()
    await wal.truncate(lsns[-1])
    return lsns


async def test_a_segment_no_longer_needed_becomes_the_next_one(
    tmp_path: Path, io: BlockingIO
) -> None:
    wal = fresh(tmp_path, io)
    await _fill_and_checkpoint(wal, "a", 20)  # segment 1 is covered: it becomes the spare
    (spare,) = tmp_path.glob(f"*{wal_module.SPARE_SUFFIX}")
    spare_inode, spare_size = spare.stat().st_ino, spare.stat().st_size
    assert spare_size > 20 * 20_000
    await wal.commit(wal.append(["b", "second", b"x"]))
    await wal.rotate()  # the next segment is the spare, renamed
    assert not list(tmp_path.glob(f"*{wal_module.SPARE_SUFFIX}"))
    current = max(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))
    assert current.stat().st_ino == spare_inode
    # still holds the old records (and is extended to a new segment's size)
    assert current.stat().st_size == max(spare_size, SEGMENT_BYTES)
    new = [wal.append(["b", "new", b"x" * 100]) for _ in range(3)]
    await wal.commit(new[-1])
    wal.close()  # cut to what was written
    assert current.stat().st_size == 2 * BLOCK  # the header block and one region
    records = reopen(tmp_path, io, after=new[0] - 1)
    assert [r[0] for r in records] == new
    assert {r[2] for r in records} == {"new"}


async def test_after_a_crash_a_recycled_segment_replays_only_its_new_records(
    tmp_path: Path, io: BlockingIO
) -> None:
    wal = fresh(tmp_path, io)
    old = await _fill_and_checkpoint(wal, "old", 20)
    (spare,) = tmp_path.glob(f"*{wal_module.SPARE_SUFFIX}")
    spare_data = spare.read_bytes()
    await wal.commit(wal.append(["b", "second", b"x"]))
    await wal.rotate()  # recycled, with segment 1's records after the new ones
    new = [wal.append(["b", "new", b"y" * 3000]) for _ in range(5)]
    await wal.commit(new[-1])
    current = max(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))
    data = current.read_bytes()  # what a kill -9 leaves: no close, no cut
    manifest = (tmp_path / "MANIFEST").read_bytes()
    await wal.drain()
    wal.close()
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / current.name).write_bytes(data)
    (crashed / "MANIFEST").write_bytes(manifest)  # a log of format 2 always has one
    after = new[0] - 1  # the checkpoint's position
    assert [r[0] for r in reopen(crashed, io, after)] == new
    # a torn new region over old records: replay stops at the tear, old records never count
    end = BLOCK + len(msgpack.packb([new[0], "b", "new", b"y" * 3000])) + FRAME.size
    (crashed / current.name).write_bytes(data[: end + 100] + bytes(200) + data[end + 300 :])
    assert [r[0] for r in reopen(crashed, io, after)] == new[:1]
    # a crash after the spare took its new header, before the first write: none count
    (crashed / current.name).write_bytes(
        (data[:BLOCK] + spare_data[BLOCK:]).ljust(len(data), b"\0")
    )
    assert reopen(crashed, io, after) == []
    assert old[0] < old[-1] < new[0]


async def test_one_spare_is_kept_and_older_segments_are_deleted(
    tmp_path: Path, io: BlockingIO
) -> None:
    wal = fresh(tmp_path, io)
    lsns = [wal.append(["b", "a", b"z"]) for _ in range(3)]
    await wal.rotate()
    lsns += [wal.append(["b", "b", b"z"]) for _ in range(3)]
    await wal.rotate()
    await wal.truncate(lsns[-1])  # two segments covered at once
    assert len(list(tmp_path.glob(f"*{wal_module.SPARE_SUFFIX}"))) == 1
    assert len(list(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))) == 1
    await wal.commit(wal.append(["b", "c", b"z"]))
    wal.close()
    # a restarted log finds the spare and starts its new segment in it
    wal = WriteAheadLog(tmp_path, io=io)
    assert [r[2] for r in wal.replay(lsns[-1])] == ["c"]
    wal.open(lsns[-1])
    assert not list(tmp_path.glob(f"*{wal_module.SPARE_SUFFIX}"))
    await wal.commit(wal.append(["b", "d", b"z"]))
    wal.close()
    assert [r[2] for r in reopen(tmp_path, io, lsns[-1])] == ["c", "d"]


async def test_a_blob_is_logged_as_the_records_last_element(tmp_path: Path, io: BlockingIO) -> None:
    wal = fresh(tmp_path, io)
    blob = os.urandom(70_000)
    lsns = [
        wal.append(["del", "t", ["a"]]),
        wal.append(["putb", "t", 1.5], blob),
        wal.append(["putb", "t", 2.5], b""),
        wal.append(["del", "t", ["b"]]),
    ]
    await wal.commit(lsns[-1])
    wal.close()
    assert reopen(tmp_path, io) == [
        [lsns[0], "del", "t", ["a"]],
        [lsns[1], "putb", "t", 1.5, blob],
        [lsns[2], "putb", "t", 2.5, b""],
        [lsns[3], "del", "t", ["b"]],
    ]
    # the checksum covers the blob: a flipped byte in it ends replay before that record
    segment = segment_of(tmp_path)
    data = bytearray(segment.read_bytes())
    at = data.index(blob[:64]) + 1000
    data[at] ^= 0xFF
    segment.write_bytes(bytes(data))
    assert [r[0] for r in reopen(tmp_path, io)] == lsns[:1]
