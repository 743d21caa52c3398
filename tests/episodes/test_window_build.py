"""The engine's window build: reads chunk by chunk, copies off the loop into reused buffers,
decompresses cold zstd chunks in the copy; the windows equal the steps every way."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI

from rlreplay.app.api.column_answers import window_columns_json, window_columns_msgpack
from rlreplay.app.api.gathered_writes import AnswerPieces
from rlreplay.app.api.window_answers import window_entries
from rlreplay.app.engine import windows as engine_windows
from rlreplay.app.engine.engine import Engine
from rlreplay.app.episodes.window_buffers import WindowBuffers
from rlreplay.app.episodes.windows import WindowSlices
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.stacking import Column
from rlreplay.wire.codec import from_jsonable, unpackb
from rlreplay.wire.window_schemas import WindowSampleRequest
from tests.api.conftest import app
from tests.episodes.test_episode_memory import episode_table, held_under_limit

__all__ = ["app"]  # the in-process app's fixture

FRAME = (6, 5)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", storage_mode="memory")


def frames(episode: int, start: int, k: int) -> np.ndarray:
    """Frames that say which episode and step they are."""
    steps = np.arange(start, start + k)
    out = np.zeros((k, *FRAME), np.uint8)
    out[:, 0, 0] = episode
    out[:, 0, 1] = steps % 256
    out[:, 1, 0] = steps // 256
    return out


async def fill(app: FastAPI, table: str, compression: str) -> dict[str, int]:
    engine = app.state.engine
    config = {"episodes": {"compression": compression, "frame_stack": {"obs": 3}}}
    await engine.create_table(table, TableConfig.model_validate(config))
    lengths = {"e0": 70, "e1": 45, "e2": 9}
    for e, (name, length) in enumerate(lengths.items()):
        for start in range(0, length, 20):  # several appends: sealed chunks and a tail
            k = min(20, length - start)
            end = "truncated" if start + k == length and e != 2 else None
            final = {"obs": np.full(FRAME, 200 + e, np.uint8)} if end else None
            steps = {"obs": frames(e, start, k), "reward": np.ones(k, np.float32)}
            await engine.episodes.append(
                table, name, start=start, steps=steps, end=end, final=final, wait=True
            )
    return lengths


def check(sample: object, lengths: dict[str, int], n: int, w: int) -> None:
    batch = sample.batch  # type: ignore[attr-defined]
    for b, (name, start) in enumerate(
        zip(sample.episodes, sample.starts.tolist(), strict=True)  # type: ignore[attr-defined]
    ):
        e, length = int(name[1:]), lengths[name]
        for i in range(w):
            t = start + i
            if t >= length:
                assert not batch.mask[b, i] and not batch.columns["obs"][b, i].any()
                continue
            for j in range(3):
                want = frames(e, max(0, t - 2 + j), 1)[0]
                np.testing.assert_array_equal(batch.columns["obs"][b, i, j], want)
            nxt = min(t + n, length) if e != 2 else t + n
            for j in range(3):
                step = nxt - 2 + j
                if step == length:
                    want = np.full(FRAME, 200 + e, np.uint8)
                else:
                    want = frames(e, max(0, step), 1)[0]
                np.testing.assert_array_equal(batch.next["obs"][b, i, j], want, err_msg=str(t))


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("off_loop", [True, False])
@pytest.mark.parametrize("gather", [True, False])
async def test_windows_equal_the_steps_built_every_way(
    app: FastAPI, compression: str, off_loop: bool, gather: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_windows, "GATHER_MAX_STEPS", 100 if gather else 0)
    lengths = await fill(app, "t", compression)
    windows = app.state.engine.windows
    windows.fill_off_loop_bytes = 0 if off_loop else 1 << 60
    et = app.state.engine.core.table("t").episodes
    et.cache.clear()  # cold: zstd chunks decompressed in the copy, then cached
    request = WindowSampleRequest(
        batch_size=48, length=9, n_step=3, pad=True, next_fields=["obs"], gamma=0.9
    )
    first = await windows.sample("t", request)
    if compression == "zstd":
        assert len(et.cache) > 0
    kept = {f: a.copy() for f, a in first.batch.columns.items()}
    # a second sample while the first is held: the first's arrays keep their bytes
    second = await windows.sample("t", request)
    for f, a in first.batch.columns.items():
        np.testing.assert_array_equal(a, kept[f])
    check(first, lengths, 3, 9)
    check(second, lengths, 3, 9)
    # the slow arms give the same windows
    monkeypatch.setattr(engine_windows, "READ_BY_CHUNK", False)
    monkeypatch.setattr(engine_windows, "REUSE_BUFFERS", False)
    check(await windows.sample("t", request), lengths, 3, 9)


async def test_a_dropped_batch_gives_its_buffer_back(app: FastAPI) -> None:
    await fill(app, "r", "none")
    windows = app.state.engine.windows
    request = WindowSampleRequest(batch_size=256, length=40, fields=["obs"])  # 920 kB
    sample = await windows.sample("r", request)
    address = sample.batch.columns["obs"].__array_interface__["data"][0]
    del sample
    again = await windows.sample("r", request)
    assert again.batch.columns["obs"].__array_interface__["data"][0] == address


def test_a_large_answer_keeps_its_buffer_until_it_is_sent() -> None:
    buffers = WindowBuffers()
    shape, u8 = (64, 80, 4, 21, 21), np.dtype(np.uint8)  # 8.6 MB
    batch = buffers(shape, u8)
    batch[...] = 7
    address = batch.__array_interface__["data"][0]
    answer = window_columns_msgpack([("columns", {"obs": Column.of(batch)})])
    assert isinstance(answer, AnswerPieces)  # sent where the build wrote it, not copied
    del batch
    other = buffers(shape, u8)  # the answer still holds the first buffer
    assert other.__array_interface__["data"][0] != address
    other[...] = 9
    assert unpackb(answer.join())["columns"]["obs"].min() == 7
    del answer, other
    again = buffers(shape, u8)  # sent: reused
    assert again.__array_interface__["data"][0] == address


@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.parametrize("gather", [True, False])
async def test_windows_of_chunks_in_rocksdb_are_read_back_off_the_loop(
    tmp_path: Path, compression: str, gather: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_windows, "GATHER_MAX_STEPS", 100 if gather else 0)
    settings = Settings(
        data_dir=tmp_path / "data",
        storage_mode="hybrid",
        cache_memory_limit_mb=1.0,
        io_threads=2,
        wal_writer="thread",
    )
    rng = np.random.default_rng(1)
    data = {f"e{n}": rng.integers(0, 256, size=(300, 32, 32), dtype=np.uint8) for n in range(12)}
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
        await eng.episodes.read("eps", "e11")  # every append applied
        await held_under_limit(eng)
        e = episode_table(eng)
        e.cache.clear()
        real_fetch = e.residency.fetch
        threads: list[int] = []

        def fetch(keys: list[bytes]) -> list[bytes]:
            threads.append(threading.get_ident())
            return real_fetch(keys)

        e.residency.fetch = fetch  # type: ignore[method-assign]
        request = WindowSampleRequest(batch_size=32, length=50)
        sample = await eng.windows.sample("eps", request)
        e.residency.fetch = real_fetch  # type: ignore[method-assign]
        assert threads and threading.get_ident() not in threads
        for b, (name, start) in enumerate(
            zip(sample.episodes, sample.starts.tolist(), strict=True)
        ):
            got = sample.batch.columns["obs"][b]
            np.testing.assert_array_equal(got, data[name][start : start + 50])
    finally:
        await eng.stop()


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_large_fields_are_sent_where_the_chunks_lie(
    app: FastAPI, compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = app.state.engine
    await engine.create_table("big", TableConfig(episodes={"compression": compression}))
    rng = np.random.default_rng(3)
    data = {
        name: rng.integers(0, 256, (n, 32, 40), dtype=np.uint8)
        for name, n in [("a", 90), ("b", 33)]
    }
    for name, obs in data.items():
        end = "terminated" if name == "a" else None  # b stays open: its tail is read too
        steps = {"obs": obs, "action": np.arange(len(obs), dtype=np.int32)}
        await engine.episodes.append("big", name, start=0, steps=steps, end=end, wait=True)
    request = WindowSampleRequest(batch_size=40, length=20, pad=True)
    answers = {}
    for sliced in (True, False):
        monkeypatch.setattr(engine_windows, "SLICE_WINDOWS", sliced)
        sample = await engine.windows.sample("big", request)
        obs = sample.batch.columns["obs"]
        assert (type(obs) is WindowSlices) == sliced
        assert type(sample.batch.columns["action"]) is np.ndarray  # 4 bytes a step: copied
        answer = window_columns_msgpack(window_entries(sample))
        if sliced:  # sent where the chunks lie
            assert isinstance(answer, AnswerPieces)
        got = unpackb(answer.join() if isinstance(answer, AnswerPieces) else bytes(answer))
        for b, (name, start) in enumerate(
            zip(got["episodes"], got["starts"].tolist(), strict=True)
        ):
            stored = data[name][start : start + 20]
            np.testing.assert_array_equal(got["columns"]["obs"][b, : len(stored)], stored)
            assert not got["columns"]["obs"][b, len(stored) :].any()  # padding: zeros
            np.testing.assert_array_equal(got["mask"][b], np.arange(20) < len(stored))
        answers[sliced] = got
        as_json = from_jsonable(window_columns_json(window_entries(sample)))  # joined
        np.testing.assert_array_equal(as_json["columns"]["obs"], got["columns"]["obs"])
    assert list(answers[True]["columns"]) == ["obs", "action"]


async def test_next_frames_of_transitions_are_sent_where_the_chunks_lie(app: FastAPI) -> None:
    engine = app.state.engine
    await engine.create_table("nx", TableConfig(episodes={"compression": "zstd"}))
    rng = np.random.default_rng(5)
    obs = rng.integers(0, 256, (70, 32, 40), dtype=np.uint8)
    steps = {"obs": obs, "reward": rng.standard_normal(70).astype(np.float32)}
    await engine.episodes.append("nx", "e", start=0, steps=steps, end="terminated", wait=True)
    request = WindowSampleRequest(batch_size=64, length=1, n_step=3, next_fields=["obs"])
    sample = await engine.windows.sample("nx", request)
    assert type(sample.batch.next["obs"]) is WindowSlices
    entries = dict(window_entries(sample))
    column = entries["next"]["obs"]
    assert type(column) is Column and type(column.data) is not np.ndarray  # not joined
    answer = window_columns_msgpack(window_entries(sample))
    assert isinstance(answer, AnswerPieces)
    got = unpackb(answer.join())
    nxt = sample.batch.targets.next_steps[:, 0]
    for b, step in enumerate(nxt.tolist()):
        want = obs[step] if step < len(obs) else np.zeros_like(obs[0])  # no final: zeros
        np.testing.assert_array_equal(got["next"]["obs"][b, 0], want)
    none = WindowSampleRequest(batch_size=0, length=1, n_step=3, next_fields=["obs"])
    figures = await engine.windows.sample("nx", none)  # no windows: slices of none
    assert figures.batch.next["obs"].shape == (0, 1, 32, 40) and figures.selectable > 0
