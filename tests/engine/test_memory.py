"""Hybrid mode keeps resident memory bounded by the cache limit plus a fixed overhead."""

from __future__ import annotations

from pathlib import Path

from tests.engine.child_process import run_child

MB = 2**20
# Resident memory the server may use above the cache limit while values stream through it:
# RocksDB's memtables (2 x 32 MiB, app/storage/rocks.py) and block cache (8 MiB), the log's
# buffers, the index, and glibc heap slack (see app/storage/allocator.py). Measured at 74-84 MB
# above the cache limit on a quiet 2-core machine and 105 MB under CI's load (see
# docs/architecture.md); the test allows 130 MB.
STATED_OVERHEAD_MB = 130


def test_600mb_through_a_32mb_cache(tmp_path: Path) -> None:
    r = run_child("tests.engine.memory_child", str(tmp_path / "data"))
    assert r["all_intact"], "a value did not read back intact"
    assert r["stats"]["size"] == r["items"] == 15360
    assert r["stats"]["bytes_on_disk"] >= 600 * MB
    grown_mb = (r["peak_rss"] - r["baseline_rss"]) / MB
    limit_mb = r["cache_limit"] / MB
    base_mb = r["baseline_rss"] / MB
    print(f"baseline {base_mb:.0f} MB, peak +{grown_mb:.0f} MB, cache {limit_mb:.0f} MB")
    assert grown_mb <= limit_mb + STATED_OVERHEAD_MB
