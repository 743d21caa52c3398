"""A checkpoint's metadata records, built from a table's columns a step at a time, are the
bytes of each item's own record (what a restart reads back), whatever metadata it has."""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.storage.layout import META, unpack_meta
from rlreplay.app.tables.config import SamplerSpec, TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.app.writer.state import meta_bytes, meta_records
from tests.engine.conftest import make_settings


def _items(kind: str, n: int) -> list[NewItem]:
    out = []
    for i in range(n):
        value = msgpack.packb({"score": float(i % 5), "obs": "x" * (i % 7)})
        group = version = tags = None
        if kind == "versions" and i % 3 == 0:
            version = i
        if kind == "mixed":
            group = f"g{i % 4}" if i % 2 == 0 else None
            version = i if i % 3 == 0 else None
            tags = {"env": i % 2} if i % 5 == 0 else None
        out.append(NewItem(f"k{i}", value, 1.0 + i, group=group, version=version, tags=tags))
    return out


@pytest.mark.parametrize("kind", ["plain", "versions", "mixed", "indexed"])
async def test_step_records_are_each_items_own_record(tmp_path: Path, kind: str) -> None:
    eng = Engine(make_settings(tmp_path, storage_mode="hybrid"))
    await eng.start()
    try:
        sampler = SamplerSpec(type="score") if kind == "indexed" else None
        await eng.create_table("t", TableConfig(sampler=sampler) if sampler else TableConfig())
        await eng.push("t", _items(kind, 300), wait=True)
        await eng.delete("t", [f"k{i}" for i in range(0, 300, 11)])
        await eng.sample("t", 50)  # times sampled
        await eng.flush()
        t = eng._state.tables["t"]
        slots = np.flatnonzero([k is not None for k in t.keys])
        rng = np.random.default_rng(0)
        slots = slots[rng.permutation(len(slots))]  # a step visits in any order
        records = meta_records(t, slots)
        assert records == [meta_bytes(t, slot) for slot in slots.tolist()]
        assert len(records) == 300 - 28
        rollouts = [unpack_meta(r)[6] for r in records]
        if kind in ("plain", "indexed"):
            assert all(r is None for r in rollouts)
        else:
            assert any(r is not None for r in rollouts) and any(r is None for r in rollouts)
        if kind == "plain":
            assert {len(r) for r in records} == {META.size}
        if kind == "indexed":
            assert all(unpack_meta(r)[5]["score"] in range(5) for r in records)
    finally:
        await eng.stop()
