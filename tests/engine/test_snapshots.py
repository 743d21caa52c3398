"""Snapshots through the engine: taken in the writer's order, uploaded incrementally, and
restored into an empty data directory, in every storage mode and over ``memory://``
(in process: a ``memory://`` filesystem lives as long as the process)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from pathlib import Path

import fsspec
import msgpack
import pytest

from rlreplay.app.backup import BackupStore
from rlreplay.app.engine.engine import Engine
from rlreplay.app.engine.snapshots import RestoreRefused
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.wire.errors import DeadlineExceeded, NotConfigured, TableNotFound, Unavailable
from tests.engine.conftest import item, make_settings
from tests.tables.test_state_restart import LIMITED as LIMITED_CONFIG

PRIORITIZED = TableConfig.model_validate({"sampler": {"type": "prioritized"}})
LIMITED = TableConfig.model_validate(LIMITED_CONFIG)


@pytest.fixture
def memory_url() -> object:
    url = f"memory://snapshots-{uuid.uuid4().hex}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


async def _start(settings: Settings) -> Engine:
    """A started engine (with a table ``t`` unless recovery brought one back)."""
    engine = Engine(settings)
    await engine.start({"t": TableConfig()})
    return engine


async def _fill(engine: Engine) -> None:
    await engine.create_table("prio", PRIORITIZED)
    await engine.create_table("limited", LIMITED)
    await engine.push("prio", [item(f"p{i}", {"i": i}, float(i + 1)) for i in range(50)], wait=True)
    await engine.push("limited", [item(f"l{i}", i) for i in range(6)], wait=True)
    await engine.sample_batch("limited", 10, timeout_s=1)  # the limiter is at its bound now


async def _check_restored(engine: Engine) -> None:
    assert engine.table_names() == ["limited", "prio"]
    assert engine.describe("prio")["config"] == PRIORITIZED.to_wire()
    got = await engine.get_many("prio", [f"p{i}" for i in range(50)])
    assert [msgpack.unpackb(g.value) for g in got if g is not None] == [{"i": i} for i in range(50)]
    assert [g.priority for g in got if g is not None] == [float(i + 1) for i in range(50)]
    # the limiter's counts came back: one more sample still waits for an insert
    with pytest.raises(DeadlineExceeded):
        await engine.sample_batch("limited", 1, timeout_s=0.2)
    await engine.push("limited", [item("l-new", 1)], wait=True)
    assert len(await engine.sample_batch("limited", 1, timeout_s=5)) == 1


@pytest.mark.parametrize("mode", ["hybrid", "disk", "memory"])
async def test_a_snapshot_restores_into_an_empty_data_dir(
    tmp_path: Path, memory_url: str, mode: str
) -> None:
    settings = make_settings(
        tmp_path / "a", storage_mode=mode, backup_url=memory_url, backup_interval_s=0
    )
    engine = Engine(settings)
    await engine.start()
    try:
        await _fill(engine)
        info = await engine.take_snapshot()
        # written after the snapshot: not in it
        await engine.push("prio", [item("late", 1)], wait=True)
    finally:
        await engine.stop()
    assert info.items == 56 and info.tables == ["limited", "prio"]
    assert [s.id for s in await _listed(settings)] == [info.id]

    restored = Engine(
        make_settings(
            tmp_path / "b",
            storage_mode=mode,
            backup_url=memory_url,
            backup_interval_s=0,
            restore="latest",
            default_table=False,
        )
    )
    await restored.start()
    try:
        await _check_restored(restored)
        assert await restored.get("prio", "late") is None
    finally:
        await restored.stop()


async def _listed(settings: object) -> list[object]:
    engine = Engine(settings)  # type: ignore[arg-type]
    await engine.start()
    try:
        return list(await engine.list_snapshots())
    finally:
        await engine.stop()


async def test_a_second_snapshot_uploads_only_the_new_files(tmp_path: Path) -> None:
    url = (tmp_path / "backups").as_uri()
    settings = make_settings(tmp_path / "data", backup_url=url, backup_interval_s=0)
    engine = await _start(settings)
    try:
        await engine.push("t", [item(f"k{i}", os.urandom(4096)) for i in range(2000)])
        await engine.flush()
        first = await engine.take_snapshot()
        assert engine.snapshots is not None
        sent_first = engine.snapshots.bytes_uploaded
        await engine.push("t", [item(f"new{i}", b"y" * 100) for i in range(10)], wait=True)
        second = await engine.take_snapshot()
        sent_second = engine.snapshots.bytes_uploaded - sent_first
    finally:
        await engine.stop()
    store = BackupStore(url)
    old, new = store.get(first.id), store.get(second.id)
    shared = {f.checksum for f in old.files}
    fresh = sum(f.size for f in new.files if f.checksum not in shared)
    assert sent_first == old.bytes >= 2000 * 4096 * 0.5  # the first sends everything
    assert sent_second == fresh  # the second only what the first did not have
    assert sent_second < new.bytes / 4


async def test_snapshots_need_a_backup_url_and_existing_tables(tmp_path: Path) -> None:
    engine = Engine(make_settings(tmp_path / "data"))
    await engine.start()
    try:
        with pytest.raises(NotConfigured):
            await engine.take_snapshot()
        with pytest.raises(NotConfigured):
            await engine.list_snapshots()
    finally:
        await engine.stop()
    url = (tmp_path / "backups").as_uri()
    engine = Engine(make_settings(tmp_path / "data", backup_url=url, backup_interval_s=0))
    await engine.start()
    try:
        with pytest.raises(TableNotFound):
            await engine.take_snapshot(["nope"])
    finally:
        await engine.stop()


async def test_concurrent_requests_share_one_snapshot(tmp_path: Path) -> None:
    url = (tmp_path / "backups").as_uri()
    engine = await _start(make_settings(tmp_path / "data", backup_url=url, backup_interval_s=0))
    try:
        await engine.push("t", [item(f"k{i}") for i in range(100)], wait=True)
        a, b = await asyncio.gather(engine.take_snapshot(), engine.take_snapshot())
        assert a.id == b.id
        assert len(await engine.list_snapshots()) == 1
    finally:
        await engine.stop()


async def test_a_snapshot_of_some_tables_restores_those_alone(tmp_path: Path) -> None:
    url = (tmp_path / "backups").as_uri()
    engine = Engine(make_settings(tmp_path / "a", backup_url=url, backup_interval_s=0))
    await engine.start()
    try:
        await _fill(engine)
        await engine.take_snapshot(["prio"])
    finally:
        await engine.stop()
    restored = Engine(
        make_settings(tmp_path / "b", backup_url=url, restore="latest", default_table=False)
    )
    await restored.start()
    try:
        assert restored.table_names() == ["prio"]
        assert (await restored.get("prio", "p3")) is not None
    finally:
        await restored.stop()


async def test_restore_keeps_a_data_dir_that_has_data_unless_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = (tmp_path / "backups").as_uri()
    data = tmp_path / "data"
    engine = await _start(make_settings(data, backup_url=url, backup_interval_s=0))
    try:
        await engine.push("t", [item("in-snapshot")], wait=True)
        info = await engine.take_snapshot()
        await engine.push("t", [item("local-only")], wait=True)
    finally:
        await engine.stop()

    caplog.set_level(logging.WARNING)
    kept = Engine(make_settings(data, backup_url=url, restore="latest"))
    await kept.start()
    try:
        assert await kept.get("t", "local-only") is not None
    finally:
        await kept.stop()
    assert "data of its own" in caplog.text

    with pytest.raises(RestoreRefused, match="data of its own"):
        await Engine(make_settings(data, backup_url=url, restore=info.id)).start()

    replaced = Engine(make_settings(data, backup_url=url, restore=info.id, restore_replace=True))
    await replaced.start()
    try:
        assert await replaced.get("t", "local-only") is None
        assert await replaced.get("t", "in-snapshot") is not None
    finally:
        await replaced.stop()
    assert list(data.glob("replaced-*/rocksdb/CURRENT"))  # moved aside, not deleted


async def test_a_corrupt_snapshot_is_refused_and_latest_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = (tmp_path / "backups").as_uri()
    engine = await _start(make_settings(tmp_path / "a", backup_url=url, backup_interval_s=0))
    try:
        await engine.push("t", [item("first")], wait=True)
        older = await engine.take_snapshot()
        await engine.push("t", [item("second")], wait=True)
        newer = await engine.take_snapshot()
    finally:
        await engine.stop()
    store = BackupStore(url)
    shared = {f.object for f in store.get(older.id).files}
    damaged = next(f for f in store.get(newer.id).files if f.object not in shared and f.size)
    target = tmp_path / "backups" / damaged.object
    target.write_bytes(bytes(b ^ 0xFF for b in target.read_bytes()))

    with pytest.raises(RestoreRefused, match=damaged.checksum):
        await Engine(make_settings(tmp_path / "b", backup_url=url, restore=newer.id)).start()

    caplog.set_level(logging.WARNING)
    restored = Engine(make_settings(tmp_path / "c", backup_url=url, restore="latest"))
    await restored.start()
    try:
        assert await restored.get("t", "first") is not None
        assert await restored.get("t", "second") is None
    finally:
        await restored.stop()
    assert newer.id in caplog.text and damaged.path in caplog.text


async def test_stopping_abandons_an_upload_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop does not wait for a long upload: it gives up between files, unlisted."""
    url = (tmp_path / "backups").as_uri()
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    def endless_upload(self: BackupStore, local_dir: Path, meta: object, **kw: object) -> object:
        progress = kw["progress"]
        assert callable(progress)
        loop.call_soon_threadsafe(started.set)
        for _ in range(3000):  # a file every 10 ms for 30 s, unless told to stop
            progress(0, 1)
            time.sleep(0.01)
        raise AssertionError("the upload was never told to stop")

    monkeypatch.setattr(BackupStore, "upload", endless_upload)
    engine = await _start(make_settings(tmp_path / "data", backup_url=url, backup_interval_s=0))
    try:
        snapshot = asyncio.create_task(engine.take_snapshot())
        await asyncio.wait_for(started.wait(), 60)
    finally:
        await engine.stop()
    with pytest.raises(Unavailable, match="stopping"):
        await snapshot
    assert BackupStore(url).list() == []


async def test_restore_latest_on_an_empty_url_starts_empty(tmp_path: Path) -> None:
    url = (tmp_path / "never-written").as_uri()
    engine = await _start(make_settings(tmp_path / "data", backup_url=url, restore="latest"))
    try:
        assert engine.table_names() == ["t"]
        with pytest.raises(RestoreRefused, match="no"):
            await Engine(make_settings(tmp_path / "other", backup_url=url, restore="x1")).start()
    finally:
        await engine.stop()
