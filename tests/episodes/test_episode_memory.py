"""The cache limit bounds what an episode table holds: sealed chunks (compressed or not)
and open tails count in the cache ledger, and the writer moves chunks to RocksDB past the
limit; every step reads back bit for bit, from memory, from RocksDB, and after a restart."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.episodes.episode_table import EpisodeTable
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig

LIMIT_MB = 1.0


def episode_table(eng: Engine) -> EpisodeTable:
    e = eng.core.table("eps").episodes
    assert e is not None
    return e


async def held_under_limit(eng: Engine) -> None:
    """Wait (bounded) until the writer's evictions bring the ledger, and the chunks the
    episode table holds, under the limit (the ledger lets go of a chunk it picked before
    the chunk, written to RocksDB in an I/O thread, leaves memory)."""
    ledger = eng.core.state.ledger
    residency = episode_table(eng).residency

    def under() -> bool:
        return ledger.bytes <= ledger.limit_bytes and residency.held_bytes <= ledger.limit_bytes

    for _ in range(1200):  # 60 s at most
        if under():
            break
        await asyncio.sleep(0.05)
    assert ledger.bytes <= ledger.limit_bytes
    assert residency.held_bytes <= ledger.limit_bytes


async def check_reads(eng: Engine, data: dict[str, np.ndarray]) -> None:
    e = episode_table(eng)
    e.cache.clear()
    real_fetch = e.residency.fetch
    threads: list[int] = []

    def fetch(keys: list[bytes]) -> list[bytes]:
        threads.append(threading.get_ident())
        return real_fetch(keys)

    e.residency.fetch = fetch  # type: ignore[method-assign]
    try:
        for name, obs in data.items():
            got = await eng.episodes.read("eps", name)  # evicted chunks fetched off the loop
            np.testing.assert_array_equal(got.steps["obs"], obs)
            assert got.steps["obs"].tobytes() == obs.tobytes()
    finally:
        e.residency.fetch = real_fetch  # type: ignore[method-assign]
    assert threads and threading.get_ident() not in threads
    e.cache.clear()
    for name, obs in data.items():  # a sample's reads: fetched in place
        for lo in range(0, len(obs), 97):
            got_obs = e.read(name, lo, min(len(obs), lo + 97))["obs"]
            np.testing.assert_array_equal(got_obs, obs[lo : lo + 97])


@pytest.mark.parametrize(("mode", "compression"), [("hybrid", "zstd"), ("disk", "none")])
async def test_steps_past_the_cache_limit_are_held_under_it_and_read_back(
    tmp_path: Path, mode: str, compression: str
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        storage_mode=mode,
        cache_memory_limit_mb=LIMIT_MB,
        io_threads=2,
        wal_writer="thread",
    )
    rng = np.random.default_rng(0)
    # random bytes do not compress: 16 episodes of 300 steps of 1 KiB, 4.7 MiB in all
    data = {f"e{n}": rng.integers(0, 256, size=(300, 32, 32), dtype=np.uint8) for n in range(16)}
    eng = Engine(settings)
    await eng.start()
    try:
        await eng.create_table("eps", TableConfig(episodes={"compression": compression}))
        for name, obs in data.items():
            for lo in range(0, 300, 100):
                end = "terminated" if lo == 200 else None
                await eng.episodes.append(
                    "eps", name, start=lo, steps={"obs": obs[lo : lo + 100]}, end=end
                )
        await eng.episodes.read("eps", "e15")  # every append applied
        e = episode_table(eng)
        stored = e.stored_bytes
        assert stored > 4 * LIMIT_MB * 2**20
        await held_under_limit(eng)
        assert e.residency.held_bytes <= LIMIT_MB * 2**20
        assert 0 < eng.describe("eps")["stats"]["bytes_in_cache"] == e.residency.held_bytes
        await check_reads(eng, data)
        await eng.flush()  # a checkpoint: records written, evicted chunks not written again
        await held_under_limit(eng)
        await check_reads(eng, data)
    finally:
        await eng.stop()
    eng = Engine(settings)
    await eng.start()
    try:
        e = episode_table(eng)
        assert e.stored_bytes == stored
        assert e.residency.held_bytes <= LIMIT_MB * 2**20  # a start leaves chunks in RocksDB
        await check_reads(eng, data)
    finally:
        await eng.stop()


async def test_a_checkpoint_writes_only_the_episodes_changed_since_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(data_dir=tmp_path / "data", storage_mode="hybrid", io_threads=2)
    eng = Engine(settings)
    await eng.start()
    try:
        await eng.create_table("eps", TableConfig(episodes={}))
        obs = np.zeros((40, 8), dtype=np.float32)
        for n in range(30):
            await eng.episodes.append("eps", f"e{n}", start=0, steps={"obs": obs})
        await eng.flush()
        store = eng.core.state.storage.db  # type: ignore[attr-defined]
        written: list[bytes] = []
        real_write, real_try_write = store.write, store.try_write

        def write(puts: Any, deletes: Any = (), ranges: Any = ()) -> None:
            written.extend(key for key, _ in puts)
            real_write(puts, deletes, ranges)

        def try_write(puts: Any = (), deletes: Any = (), ranges: Any = ()) -> bool:
            done: bool = real_try_write(puts, deletes, ranges)
            if done:  # a write RocksDB put off is tried again, and counted then
                written.extend(key for key, _ in puts)
            return done

        # checkpoints write in steps that never wait for a flush (try_write); evictions write
        monkeypatch.setattr(store, "write", write)
        monkeypatch.setattr(store, "try_write", try_write)
        await eng.episodes.append("eps", "e7", start=40, steps={"obs": obs}, wait=True)
        await eng.flush()
        prefix = b"e" + eng.core.table("eps").prefix
        records = [key[len(prefix) :] for key in written if key.startswith(prefix)]
        assert sorted(records) == [b"", b"e7"]  # the table's own state, and e7's record
    finally:
        await eng.stop()
    eng = Engine(settings)
    await eng.start()
    try:
        got = await eng.episodes.read("eps", "e7")
        assert got.length == 80
        assert (await eng.episodes.read("eps", "e29")).length == 40
    finally:
        await eng.stop()


async def test_chunks_evicted_before_a_crash_read_back_after_the_replay(tmp_path: Path) -> None:
    """kill -9 after evictions and before any checkpoint: the replay makes the episodes
    again (with the same numbers, so the chunks evicted meet the same keys) and every step
    reads back."""
    settings = Settings(
        data_dir=tmp_path / "data",
        storage_mode="hybrid",
        cache_memory_limit_mb=LIMIT_MB,
        io_threads=2,
        wal_writer="thread",
    )
    rng = np.random.default_rng(1)
    data = {f"e{n}": rng.integers(0, 256, size=(300, 32, 32), dtype=np.uint8) for n in range(12)}
    eng = Engine(settings)
    await eng.start()
    try:
        await eng.create_table("eps", TableConfig(episodes={"compression": "zstd"}))
        await eng.flush()  # the table's record; no episode in any checkpoint
        for name, obs in data.items():
            await eng.episodes.append("eps", name, start=0, steps={"obs": obs}, wait=True)
            if name == "e5":
                await eng.episodes.delete("eps", "e2", wait=True)  # a number not reused
        await held_under_limit(eng)
        evicted = sum(
            c is None
            for ep in episode_table(eng).episodes_held()
            for c in ep.steps.chunks_of("obs")
        )
        assert evicted > 0
    finally:
        assert eng._processor is not None
        await eng._processor.stop()  # as kill -9 leaves it: no final checkpoint
        await eng.stop()
    del data["e2"]
    eng = Engine(settings)
    await eng.start()
    try:
        assert sorted(episode_table(eng).names) == sorted(data)
        await check_reads(eng, data)
    finally:
        await eng.stop()
