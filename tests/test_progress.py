"""Long work shows its progress: log lines with honest rates and time left, or a bar on a
terminal; the start-up's restore and replay also in ``/metrics``."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import select
import struct
import termios
from pathlib import Path

import pytest

from rlreplay.app.backup.progress import ProgressInfo
from rlreplay.app.engine.engine import Engine
from rlreplay.app.metrics import Metrics
from rlreplay.app.progress import Progress, RecoveryProgress
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from tests.engine.conftest import crash, make_settings

log = logging.getLogger("tests.progress")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_time_left_until_the_work_has_run_a_while() -> None:
    """A quick first file says little about the rest: no estimate for 2 s or 2% of it."""
    clock = Clock()
    p = Progress("restore", 1e9, log=log, bar=False, clock=clock)
    clock.now += 0.1
    p.advance_to(30e6)  # 3% in 0.1 s: 300 MB/s
    assert p.seconds_left() is None
    for _ in range(30):  # then a steady 10 MB/s
        clock.now += 0.5
        p.update(5e6)
    assert p.elapsed_s > 2
    left = p.seconds_left()
    assert left is not None
    assert 0.6 * (1e9 - p.done) / 10e6 < left < 1.5 * (1e9 - p.done) / 10e6


def test_the_rate_is_smoothed() -> None:
    clock = Clock()
    p = Progress("upload", 1e9, log=log, bar=False, clock=clock)
    for _ in range(20):
        clock.now += 1
        p.update(10e6)
    clock.now += 1
    p.update(100e6)  # one burst moves the rate, not to ten times
    assert p.rate is not None and 10e6 < p.rate < 50e6


def test_a_short_transfer_gives_no_estimate_of_its_own_length() -> None:
    """The restore's "246 s left" after 0.1 s."""
    info = ProgressInfo(
        files_done=1, files_total=6, bytes_done=400, bytes_total=1_000_000, elapsed_s=0.1
    )
    assert info.seconds_left is None
    assert "time left unknown" in str(info)
    done = ProgressInfo(6, 6, 1_000_000, 1_000_000, 0.2)
    assert done.seconds_left == 0


def test_log_lines_every_interval_with_rate_and_time_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    p = Progress("export", 1000, log=log, unit="rows", every_s=5, bar=False, clock=clock)
    with caplog.at_level(logging.INFO, logger=log.name):
        for _ in range(100):
            clock.now += 0.25
            p.update(10)
        p.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 25 // 5 + 1, lines
    assert lines[0].startswith("export: ") and "rows/s" in lines[0]
    assert "s left" in lines[2]
    assert lines[-1] == "export: done, 1,000 rows in 25.0 s (40 rows/s)"


def test_a_bar_on_a_terminal() -> None:
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with os.fdopen(follower, "w") as terminal:
        p = Progress("restore", 2000, log=log, stream=terminal)
        p.update(1000)
        p.update(1000)
        p.close()
    chunks = []
    while select.select([leader], [], [], 1.0)[0]:  # what the terminal got, all of it
        try:
            chunks.append(os.read(leader, 10_000))
        except OSError:  # EIO: the terminal's other end is closed and all was read
            break
    os.close(leader)
    shown = b"".join(chunks).decode()
    assert "restore" in shown and "100%" in shown
    out = io.StringIO()
    Progress("restore", 10, log=log, stream=out).close()  # not a terminal: no bar
    assert out.getvalue() == ""


def test_a_bar_counts_whole_rows() -> None:
    out = io.StringIO()
    p = Progress("writing", 200, log=log, unit="rows", bar=True, stream=out)
    p.advance_to(150)
    p.close()
    assert "150/200" in out.getvalue() and "150.0" not in out.getvalue()


async def test_the_replay_at_start_up_logs_progress_and_sets_the_gauge(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(tmp_path, storage_mode="memory")
    eng = Engine(settings)
    await eng.start()
    await eng.create_table("t", TableConfig())
    for i in range(64):
        await eng.push("t", [NewItem(f"k{i}", b"\x01")], wait=True)
    await crash(eng)

    again = Engine(settings)
    again.core.recovery = RecoveryProgress(every_s=1e-9)  # a line at each step
    metrics = Metrics()
    metrics.watch_engine(again, max_tables=None)
    with caplog.at_level(logging.INFO):
        await again.start()
    try:
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("replay")]
        # the table's creation and 64 pushes
        assert "replay: 25% (16 of 65 records)" in lines, lines
        assert lines[-1].startswith("replay: done, 65 records in "), lines
        # the checkpoint that follows says so, rather than leave the start silent
        after = [
            r.getMessage() for r in caplog.records if "checkpoint after replay" in r.getMessage()
        ]
        assert after and after[-1].startswith("checkpoint after replay: done in "), after
        text = metrics.render().decode()
        assert 'rlreplay_recovery_progress_ratio{phase="replay"} 1' in text
        assert 'rlreplay_recovery_done{phase="replay",unit="records"} 65' in text
    finally:
        await again.stop()


async def test_a_restore_logs_its_progress_and_sets_the_gauge(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = (tmp_path / "backups").as_uri()
    first = Engine(make_settings(tmp_path / "a", backup_url=url, backup_interval_s=0))
    await first.start()
    try:
        await first.create_table("t", TableConfig())
        await first.push("t", [NewItem(f"k{i}", b"\x01" * 100) for i in range(100)], wait=True)
        assert first.snapshots is not None
        await first.snapshots.take()
    finally:
        await first.stop()
    settings = make_settings(tmp_path / "b", backup_url=url, backup_interval_s=0, restore="latest")
    restored = Engine(settings)
    metrics = Metrics()
    metrics.watch_engine(restored, max_tables=None)
    with caplog.at_level(logging.INFO):
        await restored.start()
    try:
        lines = [r.getMessage() for r in caplog.records]
        assert any(x.startswith("restore: done, ") and " kB in " in x for x in lines), lines
        assert not any("s left" in x for x in lines), lines  # a quick restore: no estimate
        assert 'rlreplay_recovery_progress_ratio{phase="restore"} 1' in metrics.render().decode()
    finally:
        await restored.stop()
