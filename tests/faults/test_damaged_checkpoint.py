"""Memory mode's checkpoint file cut, flipped, emptied or cut inside its header, after
``kill -9`` and after a clean stop: the start refuses naming the file and the bytes, never
hangs, and ``--accept-data-loss`` starts with what is whole. A file of the older format is
still read. A stop asked for while recovering (SIGTERM) ends the recovery."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest

from rlreplay.app.main import create_app
from rlreplay.app.writer.memory_checkpoint import MAGIC, read_checkpoint_file
from rlreplay.app.writer.task_processor import TaskProcessor
from tests.faults.damaged_data import (
    assert_everything_back,
    data_dir,
    flip,
    refused,
    settings,
    started,
    values,
)
from tests.live import launch_server, start_server, stop_server

MODE = "memory"


def _damage(path: Path, damage: str) -> None:
    data = path.read_bytes()
    if damage == "cut in half":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flipped byte":
        flip(path, len(data) // 2)
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "header cut short":
        path.write_bytes(data[:20])
    else:  # its last byte gone: the end marker is cut
        path.write_bytes(data[:-1])


DAMAGES = {
    "cut in half": r"is cut short: it ends at byte \d+",
    "flipped byte": r"is damaged: the chunk at bytes \d+ to \d+ fails its checksum",
    "empty": r"is empty \(0 bytes\)",
    "header cut short": r"is cut short: it ends at byte 20",
    "last byte cut": r"is cut short: it ends at byte \d+, inside the chunk",
}


@pytest.mark.parametrize("stop", ["kill", "clean"])
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_memory_checkpoint_refuses_the_start_naming_it(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, damage: str, stop: str
) -> None:
    data, answered = data_dir(tmp_path_factory, tmp_path, MODE, stop)
    path = data / "memory.ckpt"
    _damage(path, damage)

    async def run() -> None:
        refusal = await refused(data, MODE)
        assert refusal.kind == "checkpoint_damaged"
        assert str(path) in str(refusal)
        assert re.search(DAMAGES[damage], str(refusal)), refusal
        assert "--accept-data-loss" in str(refusal)
        await refused(data, MODE, wal_recovery="point-in-time")  # not the log's damage
        eng = await started(data, MODE, accept_data_loss=True)
        try:
            lost = eng.storage_stats()["data_lost"]
            assert lost["checkpoint_damaged"] == 1
            got = await values(eng, list(answered)) if "t" in eng.state.tables else {}
            assert all(got[k] in (None, v) for k, v in answered.items() if k in got)
        finally:
            await eng.stop()

    asyncio.run(run())


@pytest.mark.parametrize("stop", ["kill", "clean"])
def test_a_whole_memory_checkpoint_gives_everything_back(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, stop: str
) -> None:
    data, answered = data_dir(tmp_path_factory, tmp_path, MODE, stop)
    assert (data / "memory.ckpt").read_bytes()[: len(MAGIC)] == MAGIC
    asyncio.run(assert_everything_back(data, MODE, answered))


def _as_format_1(path: Path) -> None:
    """Rewrite a checkpoint as the older server wrote it: a header, then rows."""
    header, rows = read_checkpoint_file(path)
    packer = msgpack.Packer(use_bin_type=True)
    path.write_bytes(packer.pack(header) + b"".join(packer.pack(row) for row in rows))


def test_a_checkpoint_of_the_older_format_is_read_and_a_cut_in_it_found(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    data, answered = data_dir(tmp_path_factory, tmp_path, MODE, "clean")
    path = data / "memory.ckpt"
    _as_format_1(path)
    asyncio.run(assert_everything_back(data, MODE, answered))
    assert path.read_bytes()[: len(MAGIC)] == MAGIC  # the stop wrote format 2
    _as_format_1(path)
    path.write_bytes(path.read_bytes()[:-3])  # cut inside its last row

    async def run() -> None:
        refusal = await refused(data, MODE)
        assert "(format 1) is cut short" in str(refusal)

    asyncio.run(run())


def test_a_stop_while_recovering_ends_the_recovery(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lifespan's shutdown (SIGTERM) cancels a recovery still replaying; the next
    start recovers everything."""
    data, answered = data_dir(tmp_path_factory, tmp_path, MODE, "kill")
    real_apply = TaskProcessor.apply

    async def slow_apply(self: TaskProcessor, op: Any, **kwargs: Any) -> None:
        await asyncio.sleep(5)  # a replay that would take minutes
        await real_apply(self, op, **kwargs)

    async def run() -> None:
        monkeypatch.setattr(TaskProcessor, "apply", slow_apply)
        app = create_app(settings(data, MODE), recover_in_background=True)
        async with app.router.lifespan_context(app):
            await asyncio.sleep(0.5)  # recovering: replaying the log
            assert not app.state.engine.ready
            stopping = time.monotonic()
        assert time.monotonic() - stopping < 30  # not the minutes the replay would take
        monkeypatch.undo()
        await assert_everything_back(data, MODE, answered)

    asyncio.run(run())


# -- through the real command -------------------------------------------------------------


def test_rlreplay_serve_exits_3_on_a_damaged_checkpoint_and_never_hangs(tmp_path: Path) -> None:
    flags = ("--storage-mode", "memory")
    server = start_server(tmp_path / "first", *flags)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            for i in range(20):
                body = msgpack.packb({"items": [{"key": f"k{i}", "value": b"v" * 1000}]})
                r = c.post(
                    "/v1/tables/default/items",
                    content=body,
                    headers={"content-type": "application/msgpack"},
                )
                assert r.status_code == 202, r.text
    finally:
        stop_server(server)  # a clean stop: everything in memory.ckpt
    path = server.data_dir / "memory.ckpt"
    whole = path.read_bytes()
    for n, damaged in enumerate([b"", whole[: len(whole) // 2]]):
        path.write_bytes(damaged)
        again = launch_server(tmp_path / f"damaged-{n}", *flags, data_dir=server.data_dir)
        try:
            assert again.process.wait(60) == 3  # no hang
        finally:
            stop_server(again)
        failures = [line for line in again.log().splitlines() if "recovery failed" in line]
        assert len(failures) == 1 and str(path) in failures[0], again.log()
        assert "Traceback" not in again.log()
    told = start_server(tmp_path / "told", *flags, "--accept-data-loss", data_dir=server.data_dir)
    try:
        metrics = httpx.get(f"{told.url}/metrics", timeout=30).text
        assert 'rlreplay_recovery_data_lost_total{kind="checkpoint_damaged"} 1.0' in metrics
    finally:
        stop_server(told)
    assert "data lost: the checkpoint file" in told.log()
