"""A damaged RocksDB file never turns into silent loss: the start refuses it by name, and
damage met while serving answers 500 ``internal`` (never 507) and turns ``/healthz`` and
``/readyz`` to 503, so an orchestrator restarts the process into that refusal."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.log.framing import LogRecoveryError
from rlreplay.app.main import create_app
from rlreplay.app.settings import Settings
from rlreplay.app.storage import layout
from rlreplay.app.storage.faults import StorageDamaged
from rlreplay.app.storage.rocks import RocksStore
from rlreplay.app.storage.salvage import salvage_rocksdb
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.wire.errors import ReplayError, StorageFull, TableNotFound
from tests.live import launch_server, start_server, stop_server

MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


def settings(data_dir: Path, **overrides: Any) -> Settings:
    return Settings(data_dir=data_dir, io_threads=2, wal_writer="thread", **overrides)


def value(i: int) -> bytes:
    """A value of its own per key (so a value served from the wrong place is seen)."""
    return msgpack.packb(i.to_bytes(4, "little") * 2500)


def items(keys: range, prefix: str = "k") -> list[NewItem]:
    return [NewItem(f"{prefix}{i}", value(i), 1.0) for i in keys]


def flip(path: Path, offset: int) -> None:
    """Invert one byte of ``path``."""
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def largest_sst(db: Path) -> Path:
    return max(db.glob("*.sst"), key=lambda p: p.stat().st_size)


def _sst_middle(db: Path) -> Path:
    sst = largest_sst(db)
    flip(sst, sst.stat().st_size // 2)  # a data block: opening reads none of them
    return sst


def _sst_footer(db: Path) -> Path:
    sst = largest_sst(db)
    flip(sst, sst.stat().st_size - 10)
    return sst


def _sst_zeros(db: Path) -> Path:
    """A 4 KiB page of the largest table file reads back as zeros (a lost page write): the
    first page from 8 KiB on that held something else. A page that already held zeros (the
    value of ``k0``, at that offset once a compaction has merged the first files) would
    leave the file as it was, and an intact database starts."""
    sst = largest_sst(db)
    page = bytes(4096)
    with sst.open("r+b") as f:
        offset = 8192
        f.seek(offset)
        while (held := f.read(len(page))) == page:
            offset += len(page)
        assert len(held) == len(page), f"{sst} holds no page of data past 8 KiB to zero"
        f.seek(offset)
        f.write(page)
    return sst


def _sst_cut(db: Path) -> Path:
    sst = largest_sst(db)
    os.truncate(sst, sst.stat().st_size // 2)
    return sst


def _sst_gone(db: Path) -> Path:
    sst = largest_sst(db)
    sst.unlink()
    return sst


def _manifest(db: Path) -> Path:
    manifest = next(db.glob("MANIFEST-*"))
    flip(manifest, 40)
    return manifest


def _current(db: Path) -> Path:
    flip(db / "CURRENT", 2)
    return db / "CURRENT"


def _current_gone(db: Path) -> Path:
    (db / "CURRENT").unlink()
    return db / "CURRENT"


DAMAGE: dict[str, Callable[[Path], Path]] = {
    "sst-data-block": _sst_middle,
    "sst-footer": _sst_footer,
    "sst-4k-of-zeros": _sst_zeros,
    "sst-cut-in-half": _sst_cut,
    "sst-missing": _sst_gone,
    "manifest": _manifest,
    "current": _current,
    "current-missing": _current_gone,
}


async def _fill(data_dir: Path, mode: str, n: int = 300) -> None:
    """A table of ``n`` items of 10 KB, in several of RocksDB's table files after a clean
    stop (a checkpoint after each 50)."""
    eng = Engine(settings(data_dir, storage_mode=mode))
    await eng.start()
    try:
        await eng.create_table("t", TableConfig())
        for start in range(0, n, 50):
            await eng.push("t", items(range(start, min(n, start + 50))))
            await eng.flush()
            await eng.flush()  # the values the first one left to the log
    finally:
        await eng.stop()
    assert list((data_dir / "rocksdb").glob("*.sst"))


async def _values(eng: Engine, keys: list[str]) -> list[bytes | None]:
    """Each key's value, None where missing (all, when the table is gone)."""
    try:
        return [it.value if it else None for it in await eng.get_many("t", keys)]
    except TableNotFound:
        return [None] * len(keys)


@pytest.mark.parametrize("mode", ["hybrid", "disk"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
async def test_a_start_on_a_damaged_rocksdb_refuses_naming_the_file(
    tmp_path: Path, mode: str, damage: str
) -> None:
    data = tmp_path / "data"
    await _fill(data, mode)
    damaged = DAMAGE[damage](data / "rocksdb")
    eng = Engine(settings(data, storage_mode=mode))
    with pytest.raises(LogRecoveryError) as refused:
        await eng.start()
    message = str(refused.value)
    assert refused.value.kind == "checkpoint_damaged"
    assert str(damaged) in message
    assert "--restore" in message and "--accept-data-loss" in message
    assert not eng.ready
    # it let go of the folder: a second try refuses the same way (nothing was "repaired")
    with pytest.raises(LogRecoveryError, match=str(damaged.name)):
        await Engine(settings(data, storage_mode=mode)).start()


@pytest.mark.parametrize("damage", [name for name in sorted(DAMAGE) if name.startswith("sst-")])
async def test_a_start_refuses_damage_to_a_table_file_compaction_merged(
    tmp_path: Path, damage: str
) -> None:
    """The same refusal whatever layout compaction left: here the first 100 items merged into
    one file (as a stop on a busy machine can leave them), where ``k0``'s value of zeros
    lies 8 KiB in."""
    data = tmp_path / "data"
    await _fill(data, "disk", n=100)
    store = RocksStore(data / "rocksdb")
    store._live().compact_range(None, None)
    store.close()
    assert len(list((data / "rocksdb").glob("*.sst"))) == 1
    damaged = DAMAGE[damage](data / "rocksdb")
    with pytest.raises(LogRecoveryError, match=str(damaged.name)):
        await Engine(settings(data, storage_mode="disk")).start()


@pytest.mark.parametrize("damage", sorted(DAMAGE))
async def test_accepting_the_loss_starts_with_no_wrong_answer(tmp_path: Path, damage: str) -> None:
    """``--accept-data-loss`` salvages the database: RocksDB's repair sets aside the files it
    cannot read, and every item left half (metadata without value) is dropped, so each key
    answers its exact value or nothing; the next start needs no flag."""
    data = tmp_path / "data"
    await _fill(data, "hybrid")
    DAMAGE[damage](data / "rocksdb")
    keys = [f"k{i}" for i in range(300)]
    eng = Engine(settings(data, storage_mode="hybrid", accept_data_loss=True))
    await eng.start()
    try:
        got = await _values(eng, keys)
        for i, found in enumerate(got):
            assert found is None or found == value(i), keys[i]
        kept = {key for key, found in zip(keys, got, strict=True) if found is not None}
        if kept:
            assert eng.describe("t")["stats"]["size"] == len(kept)
            sampled = await eng.sample_batch("t", 50, timeout_s=5)
            assert set(sampled.keys) <= kept
    finally:
        await eng.stop()
    eng = Engine(settings(data, storage_mode="hybrid"))
    await eng.start()  # whole again: no flag needed
    try:
        got = await _values(eng, keys)
        assert {key for key, found in zip(keys, got, strict=True) if found is not None} == kept
    finally:
        await eng.stop()


@pytest.mark.parametrize("name", ["OPTIONS-*", "rocksdict-config.json", "LOG", "IDENTITY"])
async def test_files_rocksdb_does_not_read_back_change_nothing(tmp_path: Path, name: str) -> None:
    """Files whose content RocksDB does not rely on (it never reads OPTIONS back: the server
    passes its options; IDENTITY is only an id, LOG a diary) cost nothing when damaged:
    every item comes back with its value."""
    data = tmp_path / "data"
    await _fill(data, "hybrid", n=100)
    for path in (data / "rocksdb").glob(name):
        flip(path, min(40, path.stat().st_size - 1))
    eng = Engine(settings(data, storage_mode="hybrid"))
    await eng.start()
    try:
        got = await eng.get_many("t", [f"k{i}" for i in range(100)])
        assert [it.value if it else None for it in got] == [value(i) for i in range(100)]
    finally:
        await eng.stop()


def test_a_scan_that_meets_damage_raises_rather_than_ending(tmp_path: Path) -> None:
    """rocksdict's iterator ends quietly on a damaged block; a scan (what loading the
    tables does) must raise instead of handing back the keys before it."""
    store = RocksStore(tmp_path / "db")
    store.write([(b"m%06d" % i, bytes(1000)) for i in range(3000)])
    store.flush()
    store.close()
    _sst_middle(tmp_path / "db")
    store = RocksStore(tmp_path / "db", verify=False)  # as a store opened before the damage
    try:
        with pytest.raises(StorageDamaged, match=r"\.sst"):
            sum(1 for _ in store.scan(b"m"))
        assert store.damage is not None
        with pytest.raises(StorageDamaged):
            store.recover()  # never reopened over damage
    finally:
        store.close()


def test_a_salvage_drops_half_items_and_keeps_whole_ones(tmp_path: Path) -> None:
    """Metadata in one table file, values in two others: when RocksDB's repair sets aside
    one file of values, the items whose value it held go whole, and the others stay."""
    db = tmp_path / "db"
    tid = layout.table_id(1)
    store = RocksStore(db)
    store.write([(layout.table_key("t"), msgpack.packb({"id": 1, "config": {}}))])
    store.write([(layout.meta_key(tid, f"k{i}"), b"meta") for i in range(100)])
    store.flush()
    for half in (range(50), range(50, 100)):
        store.write([(layout.value_key(tid, f"k{i}"), value(i)) for i in half])
        store.flush()
    store.write([(layout.meta_key(layout.table_id(2), "orphan"), b"meta")])  # no table 2
    store.flush()
    store.close()
    half = largest_sst(db)  # one of the two files of values
    flip(half, half.stat().st_size // 3)
    salvaged = salvage_rocksdb(db)
    assert salvaged.lost_files == (half.name,)
    assert (salvaged.half_items, salvaged.orphaned_items) == (50, 1)
    store = RocksStore(db)
    try:
        metas = sorted(layout.item_key_of(k) for k, _ in store.scan(b"m"))
        values = {layout.item_key_of(k): v for k, v in store.scan(b"v")}
    finally:
        store.close()
    assert metas == sorted(values)
    assert set(values) in ({f"k{i}" for i in range(50)}, {f"k{i}" for i in range(50, 100)})
    assert all(v == value(int(key[1:])) for key, v in values.items())


async def test_damage_met_by_a_read_answers_500_and_turns_probes_to_503(tmp_path: Path) -> None:
    data = tmp_path / "data"
    await _fill(data, "disk", n=100)
    app = create_app(settings(data, storage_mode="disk"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            assert (await c.get("/readyz")).status_code == 200
            sst = _sst_middle(data / "rocksdb")
            body = msgpack.packb({"keys": [f"k{i}" for i in range(100)]})
            r = await c.post("/v1/tables/t/items:batchGet", content=body, headers=MSGPACK)
            assert r.status_code == 500, r.text
            error = msgpack.unpackb(r.content)["error"]
            assert error["code"] == "internal"
            assert str(sst) in error["message"]
            for probe in ("/healthz", "/readyz"):
                r = await c.get(probe)
                assert r.status_code == 503, (probe, r.text)
                assert str(sst) in r.json()["error"]["message"]


async def test_damage_met_by_a_compaction_refuses_writes_as_500_not_507(tmp_path: Path) -> None:
    """A compaction that meets a damaged block leaves RocksDB refusing every write. That is
    no full disk: pushes the cache cannot take answer 500 naming the file, a reopening
    never hides it, and the probes say the process must go."""
    data = tmp_path / "data"
    conf = settings(data, storage_mode="hybrid", cache_memory_limit_mb=2)
    eng = Engine(conf)
    await eng.start()
    try:
        await eng.create_table("t", TableConfig())
        for start in range(0, 300, 50):  # two table files whose key ranges overlap
            await eng.push("t", items(range(start, start + 50, 2)))
        await eng.flush()
        for start in range(0, 300, 50):
            await eng.push("t", items(range(start + 1, start + 50, 2)))
        await eng.flush()
        store = eng._state.store if eng._state is not None else None
        assert store is not None
        _sst_middle(data / "rocksdb")
        store._live().compact_range(None, None)  # meets the damaged block
        with pytest.raises(ReplayError) as refused:
            for start in range(1000, 2000, 50):  # past the cache: evictions must write
                await eng.push("t", items(range(start, start + 50)))
                await asyncio.sleep(0.05)
        assert type(refused.value) is ReplayError, refused.value  # 500, not StorageFull
        assert not isinstance(refused.value, StorageFull)
        assert ".sst" in refused.value.message
        assert eng.storage_damage is not None
        with pytest.raises(ReplayError) as flushed:
            await eng.flush()
        assert type(flushed.value) is ReplayError
    finally:
        await eng.stop()
    with pytest.raises(LogRecoveryError, match=r"\.sst"):
        await Engine(conf).start()


# -- a real ``rlreplay serve`` --------------------------------------------------------------


def _push_live(url: str, keys: range) -> None:
    body = msgpack.packb(
        {"items": [{"key": f"k{i}", "value": value(i)} for i in keys], "wait": True}
    )
    r = httpx.post(f"{url}/v1/tables/default/items", content=body, headers=MSGPACK, timeout=30)
    assert r.status_code == 200, r.text


def _refused_start(workdir: Path, data: Path, *flags: str) -> str:
    """Starts a server on ``data`` that must exit 3 by itself; its log."""
    server = launch_server(workdir, *flags, data_dir=data)
    try:
        assert server.process.wait(60) == 3, server.log()
    except subprocess.TimeoutExpired:
        stop_server(server)
        raise AssertionError(f"the server started on damaged data:\n{server.log()}") from None
    return server.log()


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_serve_on_a_damaged_rocksdb_exits_3_naming_the_file(tmp_path: Path, stop: str) -> None:
    data = tmp_path / "data"
    flags = ("--storage-mode", "disk", "--wal-checkpoint-mb", "1")
    server = start_server(tmp_path / "first", *flags, data_dir=data)
    try:
        for start in range(0, 400, 50):
            _push_live(server.url, range(start, start + 50))  # 4 MB: checkpoints flush SSTs
    finally:
        if stop == "sigkill":
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(15)
        else:
            stop_server(server)
    sst = _sst_middle(data / "rocksdb")
    log = _refused_start(tmp_path / "second", data, *flags)
    refusals = [line for line in log.splitlines() if "recovery failed" in line]
    assert len(refusals) == 1, log
    assert str(sst) in refusals[0] and "--restore" in refusals[0], log
    assert "Traceback" not in log, log


def test_serve_reports_damage_met_while_serving_on_both_probes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    flags = ("--storage-mode", "disk")
    server = start_server(tmp_path / "first", *flags, data_dir=data)
    try:
        _push_live(server.url, range(200))
    finally:
        stop_server(server)
    server = start_server(tmp_path / "second", *flags, data_dir=data)
    try:
        sst = _sst_middle(data / "rocksdb")
        body = msgpack.packb({"keys": [f"k{i}" for i in range(200)]})
        r = httpx.post(
            f"{server.url}/v1/tables/default/items:batchGet", content=body, headers=MSGPACK
        )
        assert r.status_code == 500, r.text
        assert str(sst) in msgpack.unpackb(r.content)["error"]["message"]
        for probe in ("/healthz", "/readyz"):
            r = httpx.get(server.url + probe)
            assert r.status_code == 503, (probe, r.text)
            assert str(sst) in r.json()["error"]["message"]
    finally:
        stop_server(server)
    log = _refused_start(tmp_path / "third", data, *flags)
    assert str(sst) in log
