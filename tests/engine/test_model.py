"""Property-based: random interleavings of engine calls against a plain dict model.

Each example runs a random program of push (waited or not), delete, get, get_many,
sample, update_priorities, flush, restart and "let the writer run" steps on an engine
with a tiny cache, so eviction and populate happen constantly, and checks every read
against the dict.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlreplay.app.engine.engine import Engine
from rlreplay.app.storage.cache import ENTRY_OVERHEAD
from rlreplay.app.tables.config import TableConfig
from tests.engine.conftest import crash, item, make_settings

KEYS = st.sampled_from([f"k{i}" for i in range(12)] + ["é/ü", "a b"])
VALUES = st.one_of(st.integers(-(2**63), 2**64 - 1), st.binary(max_size=600), st.text(max_size=20))
PRIORITY = st.floats(min_value=0, max_value=10, allow_nan=False)

STEP = st.one_of(
    st.tuples(
        st.just("push"),
        st.lists(st.tuples(KEYS, VALUES, PRIORITY), min_size=1, max_size=5),
        st.booleans(),
    ),
    st.tuples(st.just("delete"), st.lists(KEYS, min_size=1, max_size=3), st.booleans()),
    st.tuples(st.just("get"), KEYS),
    st.tuples(st.just("get_many"), st.lists(KEYS, max_size=6)),
    st.tuples(st.just("sample"), st.integers(1, 6)),
    st.tuples(st.just("priorities"), st.dictionaries(KEYS, PRIORITY, max_size=3)),
    st.tuples(st.just("yield"), st.integers(1, 5)),
    st.just(("flush",)),
    st.just(("restart",)),
    st.just(("crash",)),
)

MODES = [
    {"storage_mode": "hybrid", "cache_memory_limit_mb": 0.002},
    {"storage_mode": "disk", "cache_memory_limit_mb": 0.002},
    {"storage_mode": "memory", "cache_memory_limit_mb": 4},
    {"storage_mode": "hybrid", "cache_memory_limit_mb": 0.002, "durability": "none"},
]


async def check_cache_accounting(eng: Engine) -> None:
    """Once the writer is idle, the cache ledger charges exactly the cached values."""
    processor = eng._processor
    assert processor is not None
    for _ in range(1000):
        if processor.idle and not processor.urgent and not processor.housekeeping:
            break
        await asyncio.sleep(0.001)
    state = eng.state
    ledger = state.ledger
    assert ledger.bytes == sum(ledger.entries().values())
    expected = {}
    for table in state.tables.values():
        cached = [slot for slot, v in enumerate(table.values) if v is not None]
        for slot in cached:
            expected[(table, slot)] = int(table.size[slot]) + ENTRY_OVERHEAD
        assert table.bytes_in_cache == sum(int(table.size[slot]) for slot in cached)
    assert ledger.entries() == expected


async def run_program(mode: dict[str, Any], steps: list[tuple[Any, ...]], data_dir: Path) -> None:
    settings_ = make_settings(data_dir, **mode)
    model: dict[str, tuple[Any, float]] = {}
    eng = Engine(settings_)
    await eng.start()
    await eng.create_table("t", TableConfig())
    try:
        for step in steps:
            kind = step[0]
            if kind == "push":
                batch = [item(k, v, p) for k, v, p in step[1]]
                await eng.push("t", batch, wait=step[2])
                for k, v, p in step[1]:
                    model[k] = (v, p)
            elif kind == "delete":
                await eng.delete("t", step[1], wait=step[2])
                for k in step[1]:
                    model.pop(k, None)
            elif kind == "get":
                got = await eng.get("t", step[1])
                expect = model.get(step[1])
                if expect is None:
                    assert got is None
                else:
                    assert got is not None
                    assert (msgpack.unpackb(got.value), got.priority) == expect
            elif kind == "get_many":
                got_many = await eng.get_many("t", step[1])
                for key, g in zip(step[1], got_many, strict=True):
                    expect = model.get(key)
                    assert (g is None) == (expect is None)
                    if g is not None:
                        assert (msgpack.unpackb(g.value), g.priority) == expect
            elif kind == "sample":
                if not model:
                    continue
                batch = await eng.sample("t", step[1], timeout_s=1)
                assert len(batch) == step[1]
                for b in batch:
                    assert b.key in model
                    assert b.value is not None and msgpack.unpackb(b.value) == model[b.key][0]
                    assert abs(b.probability - 1 / len(model)) < 1e-12
            elif kind == "priorities":
                updated, missing = await eng.update_priorities("t", step[1])
                present = [k for k in step[1] if k in model]
                assert (updated, missing) == (len(present), len(step[1]) - len(present))
                for k in present:
                    model[k] = (model[k][0], step[1][k])
            elif kind == "yield":
                for _ in range(step[1]):
                    await asyncio.sleep(0)
            elif kind == "flush":
                await eng.flush()
                await check_cache_accounting(eng)
            elif kind == "restart":
                await eng.stop()
                eng = Engine(settings_)
                await eng.start()
            elif kind == "crash" and settings_.durability == "wal":
                await crash(eng)
                eng = Engine(settings_)
                await eng.start()
            assert eng.describe("t")["stats"]["size"] == len(model)
        await eng.flush()
        await check_cache_accounting(eng)
        stats = eng.describe("t")["stats"]
        assert stats["size"] == len(model) and stats["pending_ops"] == 0
    finally:
        await eng.stop()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(MODES), steps=st.lists(STEP, max_size=40))
def test_engine_matches_dict_model(mode: dict[str, Any], steps: list[tuple[Any, ...]]) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="rlreplay-model-"))
    try:
        asyncio.run(run_program(mode, steps, data_dir))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
