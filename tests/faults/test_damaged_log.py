"""Damaged or missing log segments, and a checkpoint lost with the log kept, in each storage
mode, after ``kill -9`` and after a clean stop: the start refuses, naming the damage, or
gives every answered item back with its exact value. ``--accept-data-loss`` starts anyway,
counting what it went past, and the next start is clean."""

from __future__ import annotations

import asyncio
import re
import shutil
import uuid
from pathlib import Path

import fsspec
import httpx
import msgpack
import pytest

from rlreplay.app.log.framing import BLOCK, FRAME
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from tests.engine.conftest import crash
from tests.faults.damaged_data import (
    MODES,
    PUSHES,
    assert_everything_back,
    checkpoint_of,
    data_dir,
    flip,
    refused,
    remove,
    segments,
    started,
    value_of,
    values,
    zero,
)
from tests.live import launch_server, start_server, stop_server


@pytest.mark.parametrize("mode", MODES)
def test_a_hole_before_the_first_segment_refuses_the_start(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, mode: str
) -> None:
    """The oldest segment deleted after kill -9: the log no longer reaches back to the
    checkpoint's position."""
    data, answered = data_dir(tmp_path_factory, tmp_path, mode, "kill")
    oldest = segments(data)[0]
    remove(oldest)

    async def run() -> None:
        refusal = await refused(data, mode)
        assert refusal.kind == "log_missing"
        assert oldest.name in str(refusal)
        assert re.search(r"records \d+ to \d+ are missing", str(refusal))
        assert "--accept-data-loss" in str(refusal)
        # accepted: it starts with what the log still holds past the hole, and says so
        eng = await started(data, mode, accept_data_loss=True)
        try:
            assert eng.storage_stats()["data_lost"] == {"log_missing": 1}
            got = await values(eng, list(answered))
            newest = [k for k in answered if k.startswith("p2-")]
            assert {k: got[k] for k in newest} == {k: answered[k] for k in newest}
        finally:
            await eng.stop()
        # the start that went past it checkpointed: the next one is clean
        eng = await started(data, mode)
        try:
            assert not eng.storage_stats()["data_lost"]
            assert await values(eng, list(answered)) == got
        finally:
            await eng.stop()

    asyncio.run(run())


@pytest.mark.parametrize("stop", ["kill", "clean"])
@pytest.mark.parametrize("mode", MODES)
def test_a_lost_checkpoint_with_the_log_kept_refuses_the_start(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, mode: str, stop: str
) -> None:
    """data/rocksdb (or memory.ckpt) removed: the server knows from the log's segments and
    manifest that a checkpoint covered its beginning, and does not start empty."""
    data, _ = data_dir(tmp_path_factory, tmp_path, mode, stop)
    remove(checkpoint_of(data, mode))

    async def run() -> None:
        refusal = await refused(data, mode)
        assert refusal.kind == "checkpoint_missing"
        assert str(checkpoint_of(data, mode)) in str(refusal)
        assert "which is missing" in str(refusal)
        assert "MANIFEST says a checkpoint covered records up to" in str(refusal)
        # the same with --wal-recovery point-in-time: a lost checkpoint is not the log's
        await refused(data, mode, wal_recovery="point-in-time")
        eng = await started(data, mode, accept_data_loss=True)
        try:
            assert eng.storage_stats()["data_lost"]["checkpoint_missing"] == 1
            if "t" not in eng.state.tables:  # its create_table record was in the lost part
                await eng.create_table("t", TableConfig())
            await eng.push("t", [NewItem("new", b"\x01", 1.0)])
        finally:
            await crash(eng)
        # new records were numbered past every one on disk: the next start replays them
        eng = await started(data, mode)
        try:
            assert not eng.storage_stats()["data_lost"]
            assert (await values(eng, ["new"]))["new"] == b"\x01"
        finally:
            await eng.stop()

    asyncio.run(run())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("damage", ["flipped byte", "4 KiB of zeros"])
def test_damage_inside_the_newest_segment_is_not_taken_for_a_torn_tail(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, mode: str, damage: str
) -> None:
    """Whole records follow the damage in more flush regions than a crash leaves unwritten."""
    data, answered = data_dir(tmp_path_factory, tmp_path, mode, "kill")
    newest = segments(data)[-1]
    if damage == "flipped byte":
        flip(newest, BLOCK + 100)  # in the first record, after the header block
    else:
        zero(newest, 2 * BLOCK)  # the second record's region

    async def run() -> None:
        refusal = await refused(data, mode)
        assert refusal.kind == "log_damaged"
        assert newest.name in str(refusal) and "damaged at bytes" in str(refusal)
        assert "flush regions" in str(refusal)
        # point-in-time recovers up to the damage; --accept-data-loss replays past it
        eng = await started(data, mode, wal_recovery="point-in-time")
        try:
            got = await values(eng, list(answered))
            # what RocksDB held already (disk mode writes through, hybrid evicts) stays
            after = [f"p2-{i}" for i in range(0 if damage == "flipped byte" else 1, PUSHES)]
            assert all(got[k] in (None, answered[k]) for k in after)
            if mode == "memory":
                assert all(got[k] is None for k in after)
            assert {k: v for k, v in got.items() if k not in after} == {
                k: v for k, v in answered.items() if k not in after
            }
        finally:
            await eng.stop()

    asyncio.run(run())


@pytest.mark.parametrize("mode", MODES)
def test_accept_data_loss_replays_the_whole_records_after_damage(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, mode: str
) -> None:
    data, answered = data_dir(tmp_path_factory, tmp_path, mode, "kill")
    flip(segments(data)[-1], BLOCK + 100)  # the first record of the last phase

    async def run() -> None:
        eng = await started(data, mode, accept_data_loss=True)
        try:
            assert eng.storage_stats()["data_lost"] == {"log_damaged": 1}
            got = await values(eng, list(answered))
            assert got.pop("p2-0") in (None, answered.pop("p2-0"))  # RocksDB may hold it
            assert got == answered
        finally:
            await eng.stop()

    asyncio.run(run())


@pytest.mark.parametrize("stop", ["kill", "clean"])
@pytest.mark.parametrize("mode", MODES)
def test_an_empty_newest_segment_refuses_the_start(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, mode: str, stop: str
) -> None:
    """A segment is put in place with its header: one of 0 bytes was cut afterwards."""
    data, _ = data_dir(tmp_path_factory, tmp_path, mode, stop)
    newest = segments(data)[-1]
    newest.write_bytes(b"")

    async def run() -> None:
        refusal = await refused(data, mode)
        assert refusal.kind == "log_damaged"
        assert f"log {newest.name} is empty (0 bytes)" in str(refusal)

    asyncio.run(run())


@pytest.mark.parametrize("mode", MODES)
def test_a_missing_newest_segment_refuses_the_start(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, mode: str
) -> None:
    data, _ = data_dir(tmp_path_factory, tmp_path, mode, "kill")
    newest = segments(data)[-1]
    remove(newest)

    async def run() -> None:
        refusal = await refused(data, mode)
        assert refusal.kind == "log_missing"
        assert newest.name in str(refusal) and "listed in the log's MANIFEST" in str(refusal)

    asyncio.run(run())


@pytest.mark.parametrize("slots", ["one slot", "both slots"])
def test_a_damaged_manifest_slot_is_outlived_and_both_refuse_the_start(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, slots: str
) -> None:
    """The manifest is written in place, in two slots in turn: a write cut short leaves the
    other whole; both damaged, the start refuses naming it."""
    data, answered = data_dir(tmp_path_factory, tmp_path, "hybrid", "kill")
    manifest = data / "wal" / "MANIFEST"
    for at in (20,) if slots == "one slot" else (20, BLOCK + 20):
        flip(manifest, at)
    if slots == "one slot":
        asyncio.run(assert_everything_back(data, "hybrid", answered))
        return

    async def run() -> None:
        refusal = await refused(data, "hybrid")
        assert refusal.kind == "log_damaged" and str(manifest) in str(refusal)

    asyncio.run(run())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tail", ["cut record", "three regions, the first torn"])
def test_a_torn_tail_is_still_recovered_silently(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, mode: str, tail: str
) -> None:
    """Flushes in flight at a crash (never answered) left torn bytes after the last whole
    record: the start gives every answered item back and reports nothing lost."""
    data, answered = data_dir(tmp_path_factory, tmp_path, mode, "kill")
    newest = segments(data)[-1]
    log = newest.read_bytes()
    last = int(newest.stem) + PUSHES - 1  # the last answered record's LSN
    if tail == "cut record":
        torn = FRAME.pack(5000, 1234) + b"x" * 300  # its region cut short
    else:  # three regions in flight: the first torn, the two after it written whole
        torn = (FRAME.pack(5000, 1234) + b"x" * 300).ljust(BLOCK, b"\0")
        for lsn in (last + 2, last + 3):
            torn += _region(lsn)
    newest.write_bytes(log + torn)

    asyncio.run(assert_everything_back(data, mode, answered))


def _region(lsn: int) -> bytes:
    """One flush region holding a record with ``lsn`` (a delete of a key never pushed)."""
    from xxhash import xxh3_64_intdigest

    payload = msgpack.packb([lsn, "delete", 1, "t", ["never-pushed"]])
    frame = FRAME.pack(len(payload), xxh3_64_intdigest(payload)) + payload
    return frame.ljust(BLOCK, b"\0")


# -- through the real command -------------------------------------------------------------


def _push_all(url: str, n: int) -> dict[str, bytes]:
    answered = {}
    with httpx.Client(base_url=url, timeout=30) as c:
        for i in range(n):
            key, value = f"k{i}", bytes([i % 256]) * 4000
            body = msgpack.packb({"items": [{"key": key, "value": value}]})
            r = c.post(
                "/v1/tables/default/items",
                content=body,
                headers={"content-type": "application/msgpack"},
            )
            assert r.status_code == 202, r.text
            answered[key] = value
    return answered


def _damage_copy(source: Path, dest: Path, damage: str) -> str:
    """Copy the data dir ``source`` to ``dest`` and damage it; returns what the refusal
    must name."""
    shutil.copytree(source, dest)
    wal = segments(dest)
    if damage == "oldest segment deleted":
        remove(wal[0])
        return wal[0].name
    if damage == "checkpoint removed":
        remove(dest / "rocksdb")
        return "which is missing"
    if damage == "a byte flipped in a segment":
        flip(wal[0], BLOCK + 100)  # its first record: whole records follow
        return f"log {wal[0].name} is damaged at bytes"
    if damage == "newest segment emptied":
        wal[-1].write_bytes(b"")
        return f"log {wal[-1].name} is empty"
    with wal[-1].open("ab") as f:  # a torn tail: a flush in flight cut short
        f.write(FRAME.pack(5000, 1234) + b"x" * 300)
    return ""


def _get_all(url: str, keys: list[str]) -> list[bytes | None]:
    r = httpx.post(
        f"{url}/v1/tables/default/items:batchGet",
        content=msgpack.packb({"keys": keys}),
        headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return [None if it is None else it["value"] for it in msgpack.unpackb(r.content)["items"]]


def test_rlreplay_serve_exits_3_naming_each_damage_and_starts_when_told(tmp_path: Path) -> None:
    """Through the real command, once per kind of damage to the log and the checkpoint: exit
    status 3 and one line naming it; a torn tail starts with every answered item; the flag
    (its variable here) starts anyway and counts what it dropped."""
    flags = ("--storage-mode", "hybrid", "--wal-checkpoint-mb", "0.05")
    server = start_server(tmp_path / "first", *flags)
    try:
        answered = _push_all(server.url, 60)  # 240 KB: several checkpoints and segments
    finally:
        server.process.kill()
        server.process.wait(15)
    damages = [
        "oldest segment deleted",
        "checkpoint removed",
        "a byte flipped in a segment",
        "newest segment emptied",
    ]
    for n, damage in enumerate(damages):
        data = tmp_path / f"data-{n}"
        named = _damage_copy(server.data_dir, data, damage)
        again = launch_server(tmp_path / f"damaged-{n}", *flags, data_dir=data)
        try:
            assert again.process.wait(60) == 3, damage
        finally:
            stop_server(again)
        failures = [line for line in again.log().splitlines() if "recovery failed" in line]
        assert len(failures) == 1, again.log()
        assert named in failures[0] and "--accept-data-loss" in failures[0], failures[0]
        assert "Traceback" not in again.log()
    data = tmp_path / "data-torn"
    _damage_copy(server.data_dir, data, "torn tail")
    torn = start_server(tmp_path / "torn", *flags, data_dir=data)
    try:
        assert _get_all(torn.url, list(answered)) == list(answered.values())
    finally:
        stop_server(torn)
    data = tmp_path / "data-told"
    oldest = _damage_copy(server.data_dir, data, "oldest segment deleted")
    told = start_server(
        tmp_path / "told", *flags, data_dir=data, env={"RLREPLAY_ACCEPT_DATA_LOSS": "1"}
    )
    try:
        metrics = httpx.get(f"{told.url}/metrics", timeout=30).text
        assert 'rlreplay_recovery_data_lost_total{kind="log_missing"} 1.0' in metrics
        assert 'rlreplay_recovery_data_lost_total{kind="checkpoint_damaged"} 0.0' in metrics
    finally:
        stop_server(told)
    assert "data lost:" in told.log() and oldest in told.log()


@pytest.mark.parametrize("mode", ["memory", "hybrid"])
@pytest.mark.parametrize("checkpoints_since", [0, 2])
async def test_restore_latest_onto_a_kept_log_refuses_a_hole_past_the_snapshot(
    tmp_path: Path, mode: str, checkpoints_since: int
) -> None:
    """The operator's way when the checkpoint is lost: remove it, keep the log, restore the
    newest snapshot. The log replayed on top must continue from the snapshot's position:
    it does when no checkpoint has cut it since, else the start refuses."""
    url = f"memory://damaged-log-{uuid.uuid4().hex}"
    data = tmp_path / "data"
    backup = {"backup_url": url, "backup_interval_s": 0}
    eng = await started(data, mode, **backup)
    await eng.create_table("t", TableConfig())
    answered: dict[str, bytes] = {}
    for phase in range(3):
        for i in range(4):
            key = f"p{phase}-{i}"
            await eng.push("t", [NewItem(key, value_of(key), 1.0)])
            answered[key] = value_of(key)
        if phase == 0:
            await eng.take_snapshot()
        elif phase <= checkpoints_since:
            await eng.flush()
    await crash(eng)
    remove(checkpoint_of(data, mode))
    try:
        if checkpoints_since:
            refusal = await refused(data, mode, restore="latest", **backup)
            assert "are missing" in str(refusal)
        else:
            eng = await started(data, mode, restore="latest", **backup)
            try:
                assert await values(eng, list(answered)) == answered
            finally:
                await eng.stop()
    finally:
        fs = fsspec.filesystem("memory")
        if fs.exists(url):
            fs.rm(url, recursive=True)
