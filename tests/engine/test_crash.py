"""kill -9 while pushing and deleting: with durability wal, nothing answered is lost."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

from rlreplay.app.engine.engine import Engine
from tests.engine.conftest import make_settings
from tests.engine.crash_child import value_of

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("mode", "wal_writer", "cache_mb"),
    [
        ("hybrid", "process", 0.2),
        ("hybrid", "thread", 0.2),
        # a cache that holds everything: the values pushed since the checkpoint before the
        # last one are in no RocksDB record, only in the log
        ("hybrid", "process", 64),
        ("disk", "process", 0.2),
        ("memory", "process", 0.2),
    ],
)
# The child is killed once it has answered this many pushes: the log is checkpointed every
# ~500 of them, so both kills land after several checkpoints, the second after many more.
@pytest.mark.parametrize("answered", [1_000, 4_000])
def test_sigkill_loses_nothing_answered(
    tmp_path: Path, mode: str, wal_writer: str, cache_mb: float, answered: int
) -> None:
    data_dir = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.engine.crash_child",
            str(data_dir),
            mode,
            wal_writer,
            str(cache_mb),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    ) as child:
        assert child.stdout is not None
        lines: list[str] = []
        try:
            assert child.stdout.readline().strip() == "ready"
            acks, deadline = 0, time.monotonic() + 120  # generous: a loaded machine is slow
            while acks < answered and time.monotonic() < deadline:
                line = child.stdout.readline()
                if not line:
                    break
                lines.append(line)
                acks += line.startswith("ack put")
        finally:
            child.send_signal(signal.SIGKILL)
            # read through the text buffer readline() filled (communicate() reads the raw
            # pipe and would drop what that buffer holds)
            rest = child.stdout.read()
            child.wait(timeout=30)
    out = "".join(lines) + rest
    state: dict[str, str] = {}  # key -> "put" / "del" for answered ops, "?" for in-flight ones
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue  # the last line may be cut by the kill
        what, op, key = parts
        if what == "sent":
            state[key] = "?" if state.get(key) != "del" or op == "del" else state[key]
        elif what == "ack":
            state[key] = op
    acked_puts = [k for k, s in state.items() if s == "put"]
    acked_dels = [k for k, s in state.items() if s == "del"]
    assert len(acked_puts) > 50, "the child answered too few pushes to test anything"

    asyncio.run(check_recovered(data_dir, mode, state, acked_puts, acked_dels))


async def check_recovered(
    data_dir: Path, mode: str, state: dict[str, str], acked_puts: list[str], acked_dels: list[str]
) -> None:
    """Restart on the same data directory and compare with what the child was answered."""
    eng = Engine(make_settings(data_dir, storage_mode=mode, cache_memory_limit_mb=0.2))
    await eng.start()
    try:
        got = await eng.get_many("t", acked_puts)
        missing = [k for k, g in zip(acked_puts, got, strict=True) if g is None]
        assert not missing, f"{len(missing)} answered pushes lost, e.g. {missing[:5]}"
        assert all(
            g is not None and g.value == value_of(k) for k, g in zip(acked_puts, got, strict=True)
        )
        back = await eng.get_many("t", acked_dels)
        assert all(g is None for g in back), "an answered delete came back"
        size = eng.describe("t")["stats"]["size"]
        in_doubt = sum(1 for s in state.values() if s == "?")
        assert len(acked_puts) <= size <= len(acked_puts) + in_doubt
        assert msgpack.unpackb(got[0].value)["key"] == acked_puts[0]  # type: ignore[union-attr]
    finally:
        await eng.stop()
