"""The engine under storage faults: checkpoints on a full disk, the log's failures, a dead
writer, samples that keep their deadline, answers past the size cap."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import msgpack
import pytest

import rlreplay.app.log.segments as segments_module
from rlreplay.app.engine.engine import Engine
from rlreplay.app.log import records
from rlreplay.app.log.wal import LogRecoveryError, WriteAheadLog
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.wire.errors import (
    DeadlineExceeded,
    Overloaded,
    StorageFull,
    Unavailable,
    ValidationFailed,
)
from rlreplay.workers.blocking import BlockingIO
from tests.faults.disk import fill, small_disk


def settings(data_dir: Path, **overrides: Any) -> Settings:
    return Settings(data_dir=data_dir, io_threads=2, **overrides)


def items(prefix: str, n: int, size: int = 10_000) -> list[NewItem]:
    return [NewItem(f"{prefix}{i}", msgpack.packb(bytes(size)), 1.0) for i in range(n)]


@pytest.mark.parametrize("mode", ["hybrid", "memory"])
async def test_a_checkpoint_failing_on_a_full_disk_leaves_the_server_writing(
    tmp_path: Path, mode: str
) -> None:
    with small_disk(tmp_path / "disk", 32) as disk:
        conf = settings(disk / "data", storage_mode=mode, wal_writer="thread")
        eng = Engine(conf)
        await eng.start()
        try:
            await eng.create_table("t", TableConfig())
            await eng.push("t", items("a", 200))  # 2 MB in the log
            filler = fill(disk)
            with pytest.raises(StorageFull, match="full"):
                await eng.flush()  # RocksDB (or memory.ckpt) cannot take the 2 MB
            assert eng.alive and eng.ready
            assert eng._processor is not None
            assert eng._processor.background_failures["checkpoint"] >= 1
            assert not list((disk / "data").glob("*.tmp"))  # no half-written checkpoint left
            got = await eng.get_many("t", ["a0", "a199"])
            assert all(it is not None for it in got)
            batch = await eng.sample_batch("t", 4, timeout_s=0.2)
            assert len(batch.keys) == 4
            filler.unlink()
            await eng.flush()  # space is back: the same engine checkpoints
            await eng.push("t", items("b", 10))
        finally:
            await eng.stop()
        eng = Engine(conf)
        await eng.start()
        try:
            got = await eng.get_many("t", ["a0", "a199", "b9"])
            assert all(it is not None for it in got)
        finally:
            await eng.stop()


async def test_disk_mode_keeps_pushes_in_the_cache_while_rocksdb_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Disk mode with RocksDB refusing writes: a push (answered: it is in the log) is
    applied through the cache instead, reads and samples see it, table ops go on, and a
    checkpoint writes it to RocksDB once RocksDB works again."""
    conf = settings(tmp_path / "d", storage_mode="disk")
    eng = Engine(conf)
    await eng.start()
    try:
        await eng.create_table("t", TableConfig())
        await eng.push("t", items("a", 4, 100), wait=True)
        store = eng._state.store if eng._state else None
        assert store is not None

        def broken(*args: Any, **kwargs: Any) -> None:
            raise OSError(errno.EIO, "Input/output error (injected)")

        monkeypatch.setattr(store, "write", broken)
        monkeypatch.setattr(store, "try_write", broken)
        await eng.push("t", items("b", 4, 100), wait=True)
        assert (await eng.get("t", "b0")) is not None
        batch = await eng.sample_batch("t", 16, timeout_s=5)
        assert set(batch.keys) <= {f"{p}{i}" for p in "ab" for i in range(4)}
        await eng.create_table("u", TableConfig())  # not held up by the failing store
        await eng.drop_table("u")
        assert eng._processor is not None and eng._processor.storage_failing
        monkeypatch.undo()
        await eng.flush()
    finally:
        await eng.stop()
    eng = Engine(conf)
    await eng.start()
    try:
        got = await eng.get_many("t", ["a0", "b3"])
        assert all(it is not None for it in got)
        assert "u" not in eng.table_names()
    finally:
        await eng.stop()


async def test_a_dead_writer_fails_waiters_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(settings(tmp_path / "d", storage_mode="memory"))
    await eng.start()
    try:
        await eng.create_table("t", TableConfig())
        processor = eng._processor
        assert processor is not None

        async def boom(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("a bug in the writer")

        monkeypatch.setattr(processor, "apply", boom)
        with pytest.raises(RuntimeError):  # the bug itself: a 500 for that request
            await eng.push("t", items("a", 1), wait=True)
        for _ in range(500):  # the writer's done-callback runs soon after
            if not eng.alive:
                break
            await asyncio.sleep(0.01)
        assert not eng.alive and not eng.ready
        assert "a bug in the writer" in (eng.writer_failure or "")
        with pytest.raises(Unavailable):  # not a wait without end
            await asyncio.wait_for(eng.sample_batch("t", 1, timeout_s=0.2), 10)
    finally:
        await eng.stop()


async def test_an_answer_past_the_size_cap_is_refused_and_consumes_nothing(
    tmp_path: Path,
) -> None:
    eng = Engine(settings(tmp_path / "d", storage_mode="memory", max_response_mb=1))
    await eng.start()
    try:
        await eng.create_table(
            "t", TableConfig.model_validate({"max_times_sampled": 1, "max_size": 100})
        )
        await eng.push("t", items("a", 50, 100_000), wait=True)  # 5 MB
        with pytest.raises(ValidationFailed, match="max-response-mb"):
            await eng.sample_batch("t", 50)
        with pytest.raises(ValidationFailed, match="max-response-mb"):
            await eng.get_many("t", [f"a{i}" for i in range(50)])
        got = await eng.get_many("t", [f"a{i}" for i in range(50)][:5])
        assert all(it is not None and it.times_sampled == 0 for it in got)
        drawn = []
        for _ in range(5):  # every item is still there to be sampled exactly once
            drawn += (await eng.sample_batch("t", 10)).keys
        assert sorted(drawn) == sorted(f"a{i}" for i in range(50))
    finally:
        await eng.stop()


async def test_the_log_refuses_for_good_what_a_failed_flush_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    io = BlockingIO(threads=1)
    wal = WriteAheadLog(tmp_path, io=io, writer="thread")
    list(wal.replay(0))
    wal.open(0)
    try:
        assert await wal.commit(wal.append(["del", "t", ["a"]])) is None
        with pytest.raises(OverflowError):
            wal.append(["create", "t", {"max_size": 2**70}])
        ok = wal.append(["del", "t", ["b"]])
        assert ok == 2  # the record that could not be packed took no LSN

        def failing(*args: Any) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(segments_module, "_pwrite_all", failing)
        with pytest.raises(OSError) as lost:
            await wal.commit(ok)
        assert lost.value.errno == errno.ENOSPC
        monkeypatch.undo()
        later = wal.append(["del", "t", ["c"]])
        await wal.commit(later)
        with pytest.raises(OSError):
            await wal.commit(ok)  # still refused, with later records durable
        assert wal.flush_failures == 1
    finally:
        wal.close()
        io.close()
    replayed = WriteAheadLog(tmp_path, io=BlockingIO(threads=1))
    assert [r[0] for r in replayed.replay(0)] == [1, 3]
    replayed.close()


async def test_replay_names_a_gap_and_point_in_time_recovers_up_to_it(
    tmp_path: Path,
) -> None:
    io = BlockingIO(threads=1)
    wal = WriteAheadLog(tmp_path, io=io, writer="thread")
    list(wal.replay(0))
    wal.open(0)
    for key in "abc":
        await wal.commit(wal.append(["del", "t", [key]]))
    await wal.rotate()
    for key in "def":
        await wal.commit(wal.append(["del", "t", [key]]))
    await wal.rotate()
    for key in "gh":
        await wal.commit(wal.append(["del", "t", [key]]))
    wal.close()
    segments = sorted(tmp_path.glob("*.wal"))
    assert len(segments) == 3
    segments[1].unlink()  # records 4 to 6 are gone
    strict = WriteAheadLog(tmp_path, io=io)
    with pytest.raises(LogRecoveryError, match=r"records 4 to 6 are missing") as gap:
        list(strict.replay(0))
    strict.close()
    assert segments[2].name in str(gap.value) and segments[0].name in str(gap.value)
    pit = WriteAheadLog(tmp_path, io=io)
    assert [r[0] for r in pit.replay(0, strict=False)] == [1, 2, 3]
    assert (tmp_path / (segments[2].name + ".skipped")).exists()
    pit.close()
    io.close()


async def test_a_server_refuses_to_start_on_a_log_with_a_gap_unless_told(
    tmp_path: Path,
) -> None:
    conf = settings(tmp_path / "d", storage_mode="memory", wal_checkpoint_mb=1000)
    eng = Engine(conf)
    await eng.start()
    await eng.create_table("t", TableConfig())
    for i in range(3):
        await eng.push("t", items(f"p{i}-", 1, 10))
        assert eng._state is not None and eng._state.wal is not None
        await eng._state.wal.rotate()
    eng._processor.horizon = 0  # type: ignore[union-attr]
    await eng._processor.stop()  # type: ignore[union-attr]
    assert eng._state.wal is not None
    await eng._state.wal.drain()
    eng._state.wal.close()
    eng._state.io.close()
    segments = sorted((tmp_path / "d" / "wal").glob("*.wal"))
    segments[1].unlink()
    with pytest.raises(LogRecoveryError, match="missing"):
        await Engine(conf).start()
    eng = Engine(settings(tmp_path / "d", storage_mode="memory", wal_recovery="point-in-time"))
    await eng.start()
    try:
        assert (await eng.get("t", "p0-0")) is not None
    finally:
        await eng.stop()


async def test_a_sample_keeps_its_deadline_under_back_pressure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer slower than the pushers fills the write queue (503 overloaded); a sample
    behind those pushes answers 504 at its deadline instead of waiting for the queue."""
    eng = Engine(settings(tmp_path / "d", storage_mode="memory", write_queue_ops=64))
    await eng.start()
    try:
        await eng.create_table("t", TableConfig())
        await eng.push("t", items("seed", 1, 10), wait=True)
        processor = eng._processor
        assert processor is not None
        real_apply = processor.apply

        async def slow_apply(op: Any, **kwargs: Any) -> None:
            await asyncio.sleep(0.05)  # a writer behind: each op takes 50 ms
            await real_apply(op, **kwargs)

        monkeypatch.setattr(processor, "apply", slow_apply)
        overloaded = 0
        for i in range(200):  # until the queue is full
            try:
                await eng.push("t", items(f"p{i}-", 8, 10))
            except Overloaded:
                overloaded += 1
                break
        assert overloaded, "the write queue never filled"
        with pytest.raises(DeadlineExceeded, match="not applied"):
            await asyncio.wait_for(eng.sample_batch("t", 4, timeout_s=0.05), 30)
    finally:
        monkeypatch.undo()
        await eng.stop()


@pytest.mark.parametrize("recovery", ["strict", "point-in-time"])
async def test_a_record_that_cannot_be_applied_is_named_not_skipped_silently(
    tmp_path: Path, recovery: str
) -> None:
    data = tmp_path / "d"
    io = BlockingIO(threads=1)
    wal = WriteAheadLog(data / "wal", io=io, writer="thread")
    list(wal.replay(0))
    wal.open(0)
    await wal.commit(wal.append(records.create_table("t", TableConfig().to_wire())))
    await wal.commit(wal.append(records.delete("t", ["a"])[:-1]))  # no keys: never written
    await wal.commit(wal.append(records.put("t", ["k"], [msgpack.packb(1)], [1.0], 1.0)))
    wal.close()
    io.close()
    eng = Engine(settings(data, storage_mode="memory", wal_recovery=recovery))
    if recovery == "strict":
        with pytest.raises(LogRecoveryError, match="log record 2"):
            await eng.start()
        return
    await eng.start()
    try:
        assert (await eng.get("t", "k")) is not None  # the records around it are applied
    finally:
        await eng.stop()
