"""RocksDB keeps the idempotency window one key per id, written by changes: a checkpoint
writes the ids answered since the last one and deletes those dropped since, whatever the
window holds; a restart (after kill -9 too) rebuilds exactly the window; a data
directory that holds the window as one value (as earlier versions wrote it) still loads,
and its next checkpoint writes the keys instead."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.storage import layout
from rlreplay.app.storage.rocks import RocksStore
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.writer import request_ids as request_ids_module
from rlreplay.app.writer.request_ids import RequestIds
from tests.engine.conftest import crash, item, make_settings

ROOT = Path(__file__).resolve().parents[2]
MODES = ["hybrid", "disk"]
#: What RocksDB holds of the window: a key per id, or (earlier versions) one value.
WINDOW_KEYS = (b"\x00id:", b"\x00request_ids")


def window_writes(store: RocksStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts, in ``[keys, bytes]``, what ``store`` is asked to write of the window (its
    keys, deleted or put, and the one value of earlier versions) from now on."""
    counts = [0, 0]
    try_write = store.try_write

    def counting(
        puts: Sequence[tuple[bytes, bytes]] = (),
        deletes: Sequence[bytes] = (),
        ranges: Sequence[tuple[bytes, bytes]] = (),
    ) -> bool:
        done = try_write(puts, deletes, ranges)
        if done:
            for key, value in [*puts, *((k, b"") for k in deletes)]:
                if key.startswith(WINDOW_KEYS):
                    counts[0] += 1
                    counts[1] += len(key) + len(value)
        return done

    monkeypatch.setattr(store, "try_write", counting)
    return counts


async def push_once(eng: Engine, request_id: str, n: int) -> int:
    """Push ``n`` items under ``request_id``: the count answered is ``n`` when the push is
    served, the first push's count when the id is a repeat."""
    items = [item(f"{request_id}-{i}") for i in range(n)]
    return await eng.push("t", items, request_id=request_id)


@pytest.mark.parametrize("mode", MODES)
async def test_a_checkpoint_writes_the_ids_that_changed_not_the_window(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(make_settings(tmp_path / "d", storage_mode=mode))
    await eng.start()
    try:
        await eng.create_table("t", TableConfig())
        for i in range(2000):
            await push_once(eng, f"old{i}", 1)
        await eng.flush()
        counts = window_writes(eng.state.storage.db, monkeypatch)
        for i in range(5):
            await push_once(eng, f"new{i}", 1)
        await eng.flush()
        # the five ids answered since: a key each, about 60 bytes (the window: 2,005 ids)
        assert counts[1] < 5 * 120
        assert counts[0] == 5
        counts[:] = [0, 0]
        await eng.flush()  # nothing changed
        assert counts == [0, 0]
    finally:
        await eng.stop()


@pytest.mark.parametrize("mode", MODES)
async def test_a_restart_after_kill_9_answers_repeats_from_the_window(
    tmp_path: Path, mode: str
) -> None:
    settings = make_settings(tmp_path / "d", storage_mode=mode)
    eng = Engine(settings)
    await eng.start()
    await eng.create_table("t", TableConfig())
    for i in range(300):
        assert await push_once(eng, f"a{i}", 2) == 2
    await eng.flush()
    await eng.flush()  # the log is cut past the first pushes: only the keys hold them
    for i in range(300):
        assert await push_once(eng, f"b{i}", 2) == 2  # in the log (and some in keys)
    await eng.flush()
    for i in range(50):
        assert await push_once(eng, f"c{i}", 2) == 2  # in the log only
    await crash(eng)

    eng = Engine(settings)
    await eng.start()
    try:
        size = eng.describe("t")["stats"]["size"]
        assert size == 2 * 650
        for prefix, n in (("a", 300), ("b", 300), ("c", 50)):
            for i in range(n):
                assert await push_once(eng, f"{prefix}{i}", 3) == 2, f"{prefix}{i}"
        assert await push_once(eng, "fresh", 3) == 3
        assert eng.describe("t")["stats"]["size"] == size + 3
    finally:
        await eng.stop()


@pytest.mark.parametrize("whole", [False, True], ids=["changes", "whole"])
@pytest.mark.parametrize("mode", MODES)
async def test_ids_the_window_dropped_stay_dropped_after_a_restart(
    tmp_path: Path, mode: str, whole: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if whole:  # every save writes the whole window in place of the saved one
        monkeypatch.setattr(request_ids_module, "_CHANGES_PER_ID", 0)
    settings = make_settings(tmp_path / "d", storage_mode=mode)
    eng = Engine(settings)
    await eng.start()
    ids = eng.state.request_ids
    ids.window_s, ids.keep = 0.0, 10  # ids leave 1,024 at a time, past the newest 10
    await eng.create_table("t", TableConfig())
    for i in range(600):
        await push_once(eng, f"a{i}", 1)
    await eng.flush()  # saves a0..a599
    for i in range(600):
        await push_once(eng, f"b{i}", 1)  # drops a0.. (and some b) from the window
    kept = {rid.removeprefix("push:") for rid in ids._at}
    assert "a0" not in kept and "b599" in kept
    for _ in range(3):  # the log is cut past every push: only the keys hold the window
        await eng.flush()
    await crash(eng)

    eng = Engine(settings)
    await eng.start()
    try:
        recovered = {rid.removeprefix("push:") for rid in eng.state.request_ids._at}
        assert recovered == kept
        assert await push_once(eng, "a0", 2) == 2  # dropped: served anew
        assert await push_once(eng, "b599", 2) == 1
    finally:
        await eng.stop()


@pytest.mark.parametrize("mode", MODES)
async def test_a_window_saved_as_one_value_loads_and_becomes_keys(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(tmp_path / "d", storage_mode=mode)
    eng = Engine(settings)
    await eng.start()
    await eng.create_table("t", TableConfig())
    for i in range(100):
        await push_once(eng, f"a{i}", 1)
    rows = [list(row) for row in eng.state.request_ids.state()]
    await eng.stop()
    # the data directory as earlier versions left it: the window in one value, no keys
    store = RocksStore(tmp_path / "d" / "rocksdb")
    try:
        store.write([(layout.REQUEST_IDS_KEY, msgpack.packb(rows))], [], [layout.REQUEST_ID_RANGE])
        store.flush()
    finally:
        store.close()

    eng = Engine(settings)
    await eng.start()
    try:
        assert await push_once(eng, "a7", 2) == 1
        counts = window_writes(eng.state.storage.db, monkeypatch)
        await eng.flush()
        assert counts[0] == 100 + 1  # the keys, and the one value deleted
        store = eng.state.storage.db
        assert store.get(layout.REQUEST_IDS_KEY) is None
        assert len(list(store.scan(layout.REQUEST_ID_PREFIX))) == 100
    finally:
        await eng.stop()
    eng = Engine(settings)
    await eng.start()
    try:
        for i in range(100):
            assert await push_once(eng, f"a{i}", 2) == 1
        assert [list(row) for row in eng.state.request_ids.state()] == rows
    finally:
        await eng.stop()


def test_changes_left_untaken_for_long_make_the_next_save_whole() -> None:
    ids = RequestIds(window_s=0.0, keep=10)
    for i in range(100):
        ids.begin(f"push:{i}")
        ids.finish(f"push:{i}", {"accepted": 1})
    changes = ids.take_changes()
    assert not changes.whole and changes.gained == [f"push:{i}" for i in range(100)]
    for i in range(100, 20_000):  # past 4 changes per id of the window (~1,000 ids)
        ids.begin(f"push:{i}")
        ids.finish(f"push:{i}", {"accepted": 1})
    ids.begin("push:in-flight")
    changes = ids.take_changes()
    assert changes.whole and changes.gained == list(ids._at)
    rows = ids.rows(changes.gained)
    assert len(rows) == len(ids) - 1  # all but the one in flight, which is gained again
    assert ids.take_changes().gained == ["push:in-flight"]


def test_a_failed_save_gives_its_changes_back() -> None:
    ids = RequestIds()
    for rid in ("push:a", "push:b"):
        ids.begin(rid)
        ids.finish(rid, {"accepted": 1})
    changes = ids.take_changes()
    ids.begin("push:c")
    ids.finish("push:c", {"accepted": 1})
    ids.give_back(changes)
    again = ids.take_changes()
    assert again.gained == ["push:a", "push:b", "push:c"] and again.lost == []
    rows: list[Any] = ids.rows(again.gained)
    assert [row[0] for row in rows] == ["push:a", "push:b", "push:c"]


# The child pushes under request ids forever, printing each id answered, with the log
# checkpointed every 0.3 MB (every ~150 pushes): a kill -9 lands in a checkpoint or between.
CHILD = """
import asyncio, sys
from pathlib import Path
import msgpack
from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem

async def worker(eng, wid):
    i = 0
    while True:
        i += 1
        rid = f"w{wid}-{i}"
        await eng.push("t", [NewItem(rid, msgpack.packb(rid * 200), 1.0)], request_id=rid)
        print("ack", rid, flush=True)

async def main(data_dir, mode):
    eng = Engine(Settings(data_dir=Path(data_dir), storage_mode=mode, wal_checkpoint_mb=0.3,
                          io_threads=2))
    await eng.start()
    await eng.create_table("t", TableConfig())
    print("ready", flush=True)
    await asyncio.gather(*(worker(eng, w) for w in range(4)))

asyncio.run(main(*sys.argv[1:3]))
"""


@pytest.mark.parametrize("mode", MODES)
def test_repeats_after_a_sigkill_in_checkpoints_are_answered_as_repeats(
    tmp_path: Path, mode: str
) -> None:
    data = tmp_path / "data"
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(data), mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        text=True,
    ) as child:
        assert child.stdout is not None
        acked: list[str] = []
        try:
            assert child.stdout.readline().strip() == "ready"
            deadline = time.monotonic() + 120  # generous: a loaded machine is slow
            while len(acked) < 3000 and time.monotonic() < deadline:
                line = child.stdout.readline()
                if not line:
                    break
                acked.append(line.split()[1])
        finally:
            child.send_signal(signal.SIGKILL)
            child.stdout.read()
            child.wait(timeout=30)
    assert len(acked) > 500, "the child answered too few pushes to test anything"

    async def check() -> None:
        eng = Engine(make_settings(data, storage_mode=mode))
        await eng.start()
        try:
            again = [await push_once(eng, rid, 2) for rid in acked]
            assert [rid for rid, n in zip(acked, again, strict=True) if n != 1] == []
        finally:
            await eng.stop()

    asyncio.run(check())
