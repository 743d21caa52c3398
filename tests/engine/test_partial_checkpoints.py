"""A checkpoint with the log on writes only what was logged before the previous one (the
rest stays in the log): a crash after two such checkpoints loses nothing answered, whatever
happened to an item between them (a patch, a replacement, a priority update, a delete)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import msgpack
import pytest

from rlreplay.app.engine.engine import Engine
from tests.engine.conftest import make_settings

ROOT = Path(__file__).resolve().parents[2]

# The child answers every write, takes two checkpoints in between, then dies without the
# clean stop's full checkpoint (os._exit: no final checkpoint, no flush of anything).
CHILD = """
import asyncio, os, sys
from pathlib import Path
import msgpack
from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem

def new(key, value, priority=1.0):
    return NewItem(key, msgpack.packb(value), priority)

async def main(data_dir, mode):
    eng = Engine(Settings(data_dir=Path(data_dir), storage_mode=mode, io_threads=1))
    await eng.start()
    await eng.create_table("t", TableConfig())
    await eng.push("t", [new(k, {"k": k}) for k in ("patched", "replaced", "kept", "deleted")])
    await eng.flush()
    await eng.patch("t", [("patched", msgpack.packb({"reward": 1.5}))])
    await eng.push("t", [new("replaced", {"k": "replaced", "again": True}, 3.0)])
    await eng.push("t", [new("fresh", {"k": "fresh"})])
    await eng.update_priorities("t", {"kept": 7.0})
    await eng.delete("t", ["deleted"])
    await eng.flush()
    await eng.patch("t", [("fresh", msgpack.packb({"reward": 2.5}))])
    await eng.flush()
    os._exit(0)

asyncio.run(main(*sys.argv[1:3]))
"""


@pytest.mark.parametrize("mode", ["memory", "hybrid", "disk"])
async def test_a_crash_after_partial_checkpoints_loses_nothing(tmp_path: Path, mode: str) -> None:
    data = tmp_path / "data"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(data), mode, cwd=ROOT
    )
    assert await asyncio.wait_for(child.wait(), 120) == 0
    eng = Engine(make_settings(data, storage_mode=mode))
    await eng.start()
    try:
        keys = ["patched", "replaced", "kept", "deleted", "fresh"]
        got = dict(zip(keys, await eng.get_many("t", keys), strict=True))
        assert got["deleted"] is None
        values = {k: msgpack.unpackb(it.value) for k, it in got.items() if it is not None}
        assert values == {
            "patched": {"k": "patched", "reward": 1.5},
            "replaced": {"k": "replaced", "again": True},
            "kept": {"k": "kept"},
            "fresh": {"k": "fresh", "reward": 2.5},
        }
        priorities = {k: it.priority for k, it in got.items() if it is not None}
        assert priorities == {"patched": 1.0, "replaced": 3.0, "kept": 7.0, "fresh": 1.0}
    finally:
        await eng.stop()
