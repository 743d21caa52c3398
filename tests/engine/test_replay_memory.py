"""A restart replays the log without holding it in memory: what the replay adds to a start's
peak resident memory is bounded by a batch and a read window, not by the log's size."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.engine.child_process import run_child

MB = 2**20
LOG_MB = 400
# The most a replay may add to a start's peak resident memory, as a share of the log it
# replays. Replaying reads a batch of records at a time (8 MiB of log) from segments read
# a 4 MiB window at a time; the values go through the 16 MiB cache into RocksDB, whose
# memtables (2 x 32 MiB) fill as they are written: about 100 MB at most, whatever the log's
# size. Measured: 30 to 90 MB above a start with nothing to replay for a 400 MB log (a
# replay that read the log whole added 735 MB, 1.8 times the log).
REPLAY_SHARE = 1 / 3


def _child(*args: str) -> dict[str, Any]:
    return run_child("tests.engine.replay_memory_child", *args)


def test_a_restart_replays_a_400mb_log_in_bounded_memory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    written = _child("write", str(data), str(LOG_MB))
    assert written["log_bytes"] >= LOG_MB * MB
    replayed = _child("recover", str(data))
    # the same data again, with the log checkpointed: what a start takes without a replay
    plain = _child("recover", str(data))
    assert replayed["replayed"] > written["items"] // 16 and plain["replayed"] == 0
    shutil.rmtree(data)
    for r in (replayed, plain):
        assert r["intact"], "a value did not read back intact"
        assert r["size"] == written["items"]
    grown = replayed["peak_rss"] - replayed["baseline_rss"]
    grown_plain = plain["peak_rss"] - plain["baseline_rss"]
    log_mb = written["log_bytes"] / MB
    print(
        f"log {log_mb:.0f} MB: a start replaying it peaks +{grown / MB:.0f} MB "
        f"in {replayed['recovery_s']:.1f} s, one with nothing to replay +{grown_plain / MB:.0f} MB"
    )
    assert grown - grown_plain < REPLAY_SHARE * written["log_bytes"]
