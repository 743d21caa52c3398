"""Checkpoints that leave to the log the values a bounded table is about to delete: the log
is cut below them while its replay stays within the recovery bound, and a crash loses
nothing."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import msgpack
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.tables.config import RemoverSpec, TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.app.writer import checkpoints as checkpoints_module
from rlreplay.app.writer.checkpoints import Checkpointer
from tests.engine.conftest import crash, make_settings

MB = 2**20
CAPACITY = 1100  # items of 4 KiB: about 4.4 MiB, past half the 8 MiB a restart may replay
PUSHES = 600  # of 16 items: about 38 MiB of log
_KEYS = [f"{n:05d}/{i:02d}" for n in range(PUSHES) for i in range(16)]


async def _fill(tmp_path: Path) -> tuple[int, list[str]]:
    """Push new keys into a FIFO table capped at :data:`CAPACITY`, with the recovery bound
    at 8 MiB of log (0.2 s at the assumed 40 MiB/s), then crash and start again: the bytes
    the checkpoints wrote, and the keys the restarted table holds."""
    settings = make_settings(tmp_path, storage_mode="hybrid", recovery_bound_s=0.2)
    eng = Engine(settings)
    await eng.start()
    try:
        await eng.create_table(
            "t", TableConfig(max_size=CAPACITY, remover=RemoverSpec(type="fifo"))
        )
        value = msgpack.packb(bytes(4096))
        for n in range(PUSHES):
            items = [NewItem(key, value, 1.0) for key in _KEYS[16 * n : 16 * n + 16]]
            await eng.push("t", items, wait=True)
        stats = eng.checkpoint_stats
        assert stats is not None and stats.checkpoints >= 4
        written = stats.bytes_total
    finally:
        await crash(eng)
    again = Engine(settings)
    await again.start()
    try:
        found = await again.get_many("t", _KEYS)
        return written, [key for key, got in zip(_KEYS, found, strict=True) if got is not None]
    finally:
        await again.stop()


async def test_a_checkpoint_leaves_a_turning_table_to_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "_LEAST_INTERVAL_BYTES", 0)
    spared, keys = await _fill(tmp_path / "spared")
    newest = _KEYS[-CAPACITY:]
    assert keys == newest  # the crash lost nothing, and brought back nothing removed
    monkeypatch.setattr(checkpoints_module, "KEEP_FRACTION", 0.0)  # cut where it was
    written, keys = await _fill(tmp_path / "written")
    assert keys == newest
    assert spared < 0.75 * written, (spared, written)


def test_the_cut_goes_down_to_the_oldest_unwritten_value_within_the_bound(
    tmp_path: Path,
) -> None:
    state = SimpleNamespace(
        settings=make_settings(tmp_path, recovery_bound_s=10),
        storage=SimpleNamespace(replay_bytes_s=0.0),
    )
    ckpt = Checkpointer(state, oldest_queued_seq=lambda: None)  # type: ignore[arg-type]
    ckpt.note_recovery(0.5, 0, 0.0)  # 40 MiB/s: 400 MiB in the bound, 300 MiB kept at most
    now = time.monotonic()
    ckpt.horizon = 0
    for last_lsn in (100, 200, 300, 400):  # four segments of 100 MiB
        ckpt._new_interval(100 * MB, now, last_lsn=last_lsn)
    assert ckpt._lower_cut(300, None) == 300  # nothing unwritten: where it was
    assert ckpt._lower_cut(300, 350) == 300  # nothing unwritten before it
    # the oldest unwritten value in the second segment: keeping it keeps 300 MiB
    assert ckpt._lower_cut(300, 150) == 149
    # the table turns over within the log: intervals of the bound's other quarter
    assert ckpt._turnover_interval == 100 * MB
    log = SimpleNamespace(bytes_since_checkpoint=101 * MB)
    assert ckpt.due(log)  # type: ignore[arg-type]
    # in the first: 400 MiB would be kept; the first segment's end keeps 300
    assert ckpt._lower_cut(300, 50) == 100
    assert ckpt._turnover_interval == 0  # what it holds takes more than the budget
    ckpt._truncated(100)
    assert ckpt._kept_after(100) == 300 * MB
    assert ckpt._lower_cut(300, 50) == 100  # never below the last cut
