"""Checkpoints the event loop does not feel: RocksDB written in steps with the writer going
on between them, a cadence that bounds recovery, and the figures /metrics shows of both."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import numpy as np
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.engine.loop_watchdog import LoopWatchdog
from rlreplay.app.metrics import Metrics
from rlreplay.app.storage.rocks import RocksStore
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.app.writer import checkpoints as checkpoints_module
from rlreplay.app.writer import storage as storage_module
from rlreplay.app.writer.apply import EVICT_STEP_BYTES
from rlreplay.app.writer.checkpoint_writes import STEP_BYTES
from rlreplay.app.writer.checkpoints import Checkpointer
from rlreplay.app.writer.loop_stalls import LoopStalls
from tests.engine.conftest import crash, make_settings

MB = 2**20


def _series(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found is not None, f"{name} is not in the scrape"
    return float(found.group(1))


def _values(prefix: str, n: int, size: int) -> list[NewItem]:
    return [NewItem(f"{prefix}{i}", msgpack.packb(bytes(size)), 1.0) for i in range(n)]


async def test_the_checkpoint_figures_appear_and_move(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, storage_mode="hybrid")
    eng = Engine(settings)
    metrics = Metrics()
    metrics.watch_engine(eng, max_tables=None)
    await eng.start()
    try:
        await eng.create_table("t", TableConfig())
        text = metrics.render().decode()
        assert _series(text, "rlreplay_checkpoints_total") == 0
        assert _series(text, "rlreplay_recovery_bound_seconds") == 30
        assert _series(text, "rlreplay_recovery_replay_bytes_per_second") == 40 * MB
        assert _series(text, "rlreplay_recovery_seconds") > 0
        await eng.push("t", _values("a", 64, 16_384), wait=True)
        await eng.flush()  # covers the pushes; writes what came before the last one: none
        await eng.flush()  # writes the pushes
        text = metrics.render().decode()
        assert _series(text, "rlreplay_checkpoints_total") == 2
        assert _series(text, "rlreplay_checkpoint_bytes_total") > 64 * 16_384
        assert _series(text, "rlreplay_checkpoint_last_bytes") > 64 * 16_384
        assert _series(text, "rlreplay_checkpoint_seconds_total") > 0
        assert _series(text, "rlreplay_checkpoint_duration_max_seconds") > 0
        assert _series(text, "rlreplay_checkpoint_loop_stall_max_seconds") >= 0
        assert _series(text, "rlreplay_checkpoint_loop_stall_last_seconds") >= 0
    finally:
        await crash(eng)
    again = Engine(settings)
    metrics = Metrics()
    metrics.watch_engine(again, max_tables=None)
    await again.start()
    try:
        assert _series(metrics.render().decode(), "rlreplay_recovery_seconds") > 0
        assert len(await again.sample("t", 64)) == 64
    finally:
        await again.stop()


async def test_pushes_are_applied_between_the_steps_of_a_checkpoint(tmp_path: Path) -> None:
    eng = Engine(make_settings(tmp_path, storage_mode="hybrid", cache_memory_limit_mb=512))
    await eng.start()
    try:
        await eng.create_table("t", TableConfig())
        for n in range(8):  # 64 MiB: 64 steps of 1 MiB
            await eng.push("t", _values(f"b{n}/", 128, 65_536), wait=True)
        await eng.flush()  # the next checkpoint writes them
        checkpoint = asyncio.ensure_future(eng.flush())
        await asyncio.sleep(0)  # the writer takes the checkpoint
        await eng.push("t", _values("during", 1, 16), wait=True)  # applied, not only logged
        assert not checkpoint.done(), "the push waited for the whole checkpoint"
        await checkpoint
        stats = eng.checkpoint_stats
        assert stats is not None and stats.last_bytes > 64 * MB
    finally:
        await eng.stop()


def _checkpointer(tmp_path: Path, saved_rate: float = 0.0, **settings: object) -> Checkpointer:
    state = SimpleNamespace(
        settings=make_settings(tmp_path, **settings),
        storage=SimpleNamespace(replay_bytes_s=saved_rate),
    )
    return Checkpointer(state, oldest_queued_seq=lambda: None)  # type: ignore[arg-type]


async def test_the_cadence_counts_on_the_replay_rate_a_start_measured_on_this_data(
    tmp_path: Path,
) -> None:
    log = SimpleNamespace(bytes_since_checkpoint=0)
    # a rate a start measured on this data was loaded with the checkpoint (for none, see
    # the test of the defaults): 10 MiB/s; this start replayed too little to measure one
    saved = _checkpointer(tmp_path, saved_rate=10 * MB)
    saved.note_recovery(0.5, MB, 0.1)
    assert saved.stats.replay_bytes_s == 10 * MB
    log.bytes_since_checkpoint = 149 * MB
    assert not saved.due(log)  # type: ignore[arg-type]
    log.bytes_since_checkpoint = 151 * MB  # 2 x 151 past 300 MiB
    assert saved.due(log)  # type: ignore[arg-type]
    # a start that replays enough measures its own, which the storage saves from then on
    measured = _checkpointer(tmp_path, saved_rate=10 * MB)
    measured.note_recovery(5.0, 500 * MB, 4.0)
    assert measured.stats.replay_bytes_s == 100 * MB
    assert measured._state.storage.replay_bytes_s == 100 * MB


@pytest.mark.parametrize("mode", ["hybrid", "memory"])
async def test_a_measured_replay_rate_is_saved_with_the_checkpoint_for_later_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setattr(checkpoints_module, "_MEASURE_AFTER_BYTES", MB)
    settings = make_settings(tmp_path, storage_mode=mode)
    eng = Engine(settings)
    await eng.start()
    await eng.create_table("t", TableConfig())
    await eng.push("t", _values("a", 64, 64 * 1024), wait=True)  # 4 MiB of log
    await crash(eng)
    again = Engine(settings)
    await again.start()  # replays the 4 MiB: measures its rate
    stats = again.checkpoint_stats
    assert stats is not None
    rate = stats.replay_bytes_s
    assert rate > 0 and rate != 40 * MB
    await again.flush()  # saves it
    await crash(again)
    monkeypatch.setattr(checkpoints_module, "_MEASURE_AFTER_BYTES", 2**40)
    third = Engine(settings)
    await third.start()  # measures nothing: counts on the saved rate
    try:
        stats = third.checkpoint_stats
        assert stats is not None and stats.replay_bytes_s == rate
    finally:
        await third.stop()


async def test_a_checkpoint_comes_due_at_the_cap_or_sooner_by_the_recovery_bound(
    tmp_path: Path,
) -> None:
    log = SimpleNamespace(bytes_since_checkpoint=0)
    capped = _checkpointer(tmp_path, wal_checkpoint_mb=256, recovery_bound_s=0)
    log.bytes_since_checkpoint = 200 * MB
    assert not capped.due(log)  # type: ignore[arg-type]
    log.bytes_since_checkpoint = 257 * MB
    assert capped.due(log)  # type: ignore[arg-type]

    bounded = _checkpointer(tmp_path, wal_checkpoint_mb=256, recovery_bound_s=2)
    bounded.note_recovery(4.0, 400 * MB, 3.0)  # a start at 100 MiB/s: 200 MiB in the bound
    # the first interval takes half: it is the previous one at the next checkpoint
    log.bytes_since_checkpoint = 99 * MB
    assert not bounded.due(log)  # type: ignore[arg-type]
    log.bytes_since_checkpoint = 101 * MB
    assert bounded.due(log)  # type: ignore[arg-type]
    assert bounded.stats.replay_bytes == 101 * MB
    assert bounded.stats.recovery_s == 4.0
    bounded._new_interval(101 * MB, time.monotonic())
    log.bytes_since_checkpoint = 98 * MB
    assert not bounded.due(log)  # type: ignore[arg-type]  # 101 + 98
    log.bytes_since_checkpoint = 100 * MB
    assert bounded.due(log)  # type: ignore[arg-type]  # 101 + 100

    # a slower replay calls for checkpoints sooner; the previous interval counts too
    slow = _checkpointer(tmp_path, wal_checkpoint_mb=256, recovery_bound_s=2)
    slow.note_recovery(4.0, 100 * MB, 3.0)  # 25 MiB/s: 50 MiB in the bound
    slow._new_interval(40 * MB, time.monotonic())
    log.bytes_since_checkpoint = 20 * MB
    assert slow.due(log)  # type: ignore[arg-type]  # 40 + 20 past 50
    log.bytes_since_checkpoint = 8 * MB
    assert not slow.due(log)  # type: ignore[arg-type]  # under the least interval


async def test_loop_stalls_measures_the_longest_wait_of_the_event_loop() -> None:
    async with LoopStalls() as stalls:
        await asyncio.sleep(0.01)
        time.sleep(0.05)  # noqa: ASYNC251 - the loop blocked, as a GIL held through a write would
        await asyncio.sleep(0.01)
    assert stalls.longest_s >= 0.04


async def test_evictions_write_in_steps_that_never_wait_for_a_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An eviction writes RocksDB as a checkpoint does: small batches with ``try_write``,
    tried again when RocksDB would stall, never the blocking ``write`` (which would wait for
    a memtable flush with the GIL held)."""
    batches: list[int] = []
    refused = [0]
    real_try_write = RocksStore.try_write

    def blocking_write(self: RocksStore, *args: object) -> None:
        raise AssertionError("a writer's write that may wait for a flush with the GIL held")

    def try_write(self: RocksStore, puts: Any = (), deletes: Any = (), ranges: Any = ()) -> bool:
        if len(batches) % 3 == 1 and refused[0] < 50:  # RocksDB would stall: nothing written
            refused[0] += 1
            batches.append(0)
            return False
        batches.append(sum(len(v) for _, v in puts))
        return real_try_write(self, puts, deletes, ranges)

    monkeypatch.setattr(RocksStore, "write", blocking_write)
    monkeypatch.setattr(RocksStore, "try_write", try_write)
    eng = Engine(make_settings(tmp_path, storage_mode="hybrid", cache_memory_limit_mb=4))
    await eng.start()
    try:
        await eng.create_table("t", TableConfig(max_size=1000))
        await eng.push("t", _values("e/", 768, 16_384), wait=True)  # 12 MiB: 8 to evict
        for n in range(8):  # then past the cap: its deletes are queued, then written
            await eng.push("t", _values(f"f{n}/", 64, 16_384), wait=True)
        stats = eng.describe("t")["stats"]
        assert stats["evictions_to_disk"] > 0
        assert refused[0] > 0
        assert max(batches) <= EVICT_STEP_BYTES + 16_384 + 1024  # a step's worth
        assert sum(b > STEP_BYTES for b in batches) >= 2  # the 8 MiB went in steps
        got = await eng.get("t", "e/300")  # evicted: served from RocksDB
        assert got is not None and got.value == msgpack.packb(bytes(16_384))
    finally:
        await crash(eng)


async def test_the_loop_watchdog_logs_the_stack_of_a_long_stall(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def block_the_loop() -> None:
        time.sleep(0.12)  # what a long call on the loop does

    watchdog = LoopWatchdog(0.04)
    watchdog.start()
    try:
        with caplog.at_level(logging.WARNING, logger="rlreplay.app.engine.loop_watchdog"):
            await asyncio.sleep(0.02)
            block_the_loop()
            deadline = time.monotonic() + 10
            while not watchdog.stalls and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.01)  # the watchdog is a thread: nothing to await
    finally:
        watchdog.stop()
    watchdog.stop()  # idempotent
    assert watchdog.stalls >= 1 and watchdog.longest_s >= 0.1
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "without a turn" in logged and "block_the_loop" in logged


async def test_memory_mode_applies_pushes_while_its_checkpoint_file_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory mode captures the tables and writes ``memory.ckpt`` in an I/O thread: pushes
    are applied meanwhile, and a crash right after loses none of them (the log from the
    captured position holds them)."""
    release = threading.Event()
    writing = threading.Event()
    real_write = storage_module.write_checkpoint_file

    def slow_write(*args: Any) -> None:
        writing.set()
        release.wait(60)
        real_write(*args)

    monkeypatch.setattr(storage_module, "write_checkpoint_file", slow_write)
    settings = make_settings(tmp_path, storage_mode="memory")
    eng = Engine(settings)
    await eng.start()
    try:
        await eng.create_table("t", TableConfig())
        await eng.push("t", _values("a", 64, 1024), wait=True)
        release.set()
        await eng.flush()
        await eng.flush()  # the next one writes the pushes
        release.clear()
        writing.clear()
        checkpoint = asyncio.ensure_future(eng.flush())
        while not writing.is_set():  # noqa: ASYNC110 - set from the I/O thread
            await asyncio.sleep(0.01)
        await asyncio.wait_for(eng.push("t", _values("during", 8, 1024), wait=True), 30)
        assert not checkpoint.done(), "the push waited for the checkpoint file"
        assert await eng.get("t", "during7") is not None
        release.set()
        await checkpoint
        assert (tmp_path / "memory.ckpt").exists()
    finally:
        release.set()
        await crash(eng)
    again = Engine(settings)
    await again.start()
    try:
        keys = [f"a{i}" for i in range(64)] + [f"during{i}" for i in range(8)]
        got = await again.get_many("t", keys)
        assert all(g is not None for g in got)
    finally:
        await again.stop()


async def test_at_the_defaults_the_recovery_bound_sets_the_cadence_not_the_cap(
    tmp_path: Path,
) -> None:
    """30 s at the assumed 40 MiB/s (no start has measured the rate on this data): 1200
    MiB of log to replay, a previous interval and this one; the 1 GiB cap is past it."""
    defaults = _checkpointer(tmp_path)
    defaults.note_recovery(0.5, 0, 0.0)
    assert defaults.stats.replay_bytes_s == 40 * MB
    log = SimpleNamespace(bytes_since_checkpoint=590 * MB)
    assert not defaults.due(log)  # type: ignore[arg-type]  # a 256 MB cap called for one
    log.bytes_since_checkpoint = 601 * MB
    assert defaults.due(log)  # type: ignore[arg-type]  # twice this interval: 1202 MiB
    defaults._new_interval(700 * MB, time.monotonic())
    log.bytes_since_checkpoint = 450 * MB
    assert not defaults.due(log)  # type: ignore[arg-type]  # 1150 MiB
    log.bytes_since_checkpoint = 501 * MB
    assert defaults.due(log)  # type: ignore[arg-type]  # 1201 MiB


@pytest.mark.parametrize(
    ("remover", "newest_first"), [("fifo", True), ("lifo", False), ("uniform", None)]
)
async def test_a_checkpoint_visits_last_what_the_remover_takes_first(
    tmp_path: Path, remover: str, newest_first: bool | None
) -> None:
    """Items a bounded FIFO table is about to remove are visited last: many are gone
    before their step comes, and are never written."""
    eng = Engine(make_settings(tmp_path, storage_mode="hybrid"))
    await eng.start()
    try:
        await eng.create_table(
            "t", TableConfig.model_validate({"max_size": 100, "remover": {"type": remover}})
        )
        for n in range(4):
            await eng.push("t", _values(f"p{n}/", 20, 16), wait=True)
        t = eng.state.tables["t"]
        slots = np.flatnonzero(np.frombuffer(t.dirty, dtype=np.uint8, count=len(t.keys)))
        assert len(slots) == 80
        visited = await storage_module._removed_last(eng.state.io, t, slots)
        orders = t.order[visited].tolist()
        if newest_first is None:
            assert visited.tolist() == slots.tolist()
        else:
            assert orders == sorted(orders, reverse=newest_first)
    finally:
        await eng.stop()
