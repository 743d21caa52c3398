"""RocksDB tuned for a checkpoint's writes: compactions at the lowest CPU priority, large
memtables, and what flushes write left uncompressed (it is rewritten soon)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from rlreplay.app.storage.rocks import RocksStore


def _nice_of_threads(prefix: str) -> list[int]:
    """The nice value of each thread of this process whose name starts with ``prefix``."""
    nices = []
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name.startswith(prefix):
            nices.append(int(stat[stat.rindex(")") + 2 :].split()[16]))
    return nices


def test_compactions_run_at_the_lowest_cpu_priority_and_flushes_do_not(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db")
    try:
        for n in range(6):  # level 0 files past the compaction trigger (4): a compaction
            store.write([(b"v" + bytes([n, i]), os.urandom(4096)) for i in range(64)])
            store.flush()
        # a pool thread lowers its own priority when it takes its next job
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            low = _nice_of_threads("rocksdb:low")
            if low and all(n == 19 for n in low):
                break
            time.sleep(0.05)
        assert low and all(n == 19 for n in low), low
        high = _nice_of_threads("rocksdb:high")
        assert high and all(n < 19 for n in high), high
    finally:
        store.close()


def test_memtables_are_large_and_level_0_is_left_uncompressed(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db")
    store.close()
    options = max((tmp_path / "db").glob("OPTIONS-*")).read_text()
    assert re.search(r"^\s*write_buffer_size=33554432$", options, re.MULTILINE)
    per_level = re.search(r"^\s*compression_per_level=(\S+)$", options, re.MULTILINE)
    assert per_level is not None
    assert per_level.group(1).split(":")[:2] == ["kNoCompression", "kNoCompression"]
