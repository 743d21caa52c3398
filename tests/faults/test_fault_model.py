"""Random interleavings of writes, table ops and checkpoints while the log and RocksDB fail
at random points (an injected OSError), checked against a plain model: no answered write
is lost and no refused write is applied, now and after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import rlreplay.app.log.segments as segments_module
from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.storage.rocks import RocksStore
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.wire.errors import StorageFull, TableExists, TableNotFound, Unavailable

KEYS = [f"k{i}" for i in range(8)]
TABLES = ["a", "b"]


@dataclass
class Faults:
    """Which layers fail now."""

    log: bool = False
    store: bool = False
    disk_full: bool = True  # ENOSPC, else EIO

    def error(self, what: str) -> OSError:
        if self.disk_full:
            return OSError(errno.ENOSPC, f"No space left on device (injected, {what})")
        return OSError(errno.EIO, f"Input/output error (injected, {what})")


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Faults:
    faults = Faults()
    real_pwrite_all = segments_module._pwrite_all
    real_live = RocksStore._live

    def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
        if faults.log:
            raise faults.error("log")
        real_pwrite_all(fd, view, offset)

    def live(self: RocksStore) -> Any:
        if faults.store:
            message = "No space left on device" if faults.disk_full else "IO error"
            raise RuntimeError(f"{message} (injected, RocksDB)")
        return real_live(self)

    monkeypatch.setattr(segments_module, "_pwrite_all", pwrite_all)
    monkeypatch.setattr(RocksStore, "_live", live)
    return faults


ops = st.one_of(
    st.tuples(
        st.just("push"),
        st.sampled_from(TABLES),
        st.lists(st.sampled_from(KEYS), min_size=1, max_size=4),
    ),
    st.tuples(
        st.just("delete"),
        st.sampled_from(TABLES),
        st.lists(st.sampled_from(KEYS), min_size=1, max_size=3),
    ),
    st.tuples(st.just("create"), st.sampled_from(TABLES)),
    st.tuples(st.just("drop"), st.sampled_from(TABLES)),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("log_fails"), st.booleans(), st.booleans()),
    st.tuples(st.just("store_fails"), st.booleans()),
    st.tuples(st.just("restart")),
)

REFUSED = (StorageFull, Unavailable)


async def run(ops_list: list[tuple[Any, ...]], mode: str, data_dir: Path, faults: Faults) -> None:
    faults.log = faults.store = False
    conf = {
        "data_dir": data_dir,
        "io_threads": 2,
        "storage_mode": mode,
        "wal_writer": "thread",  # the faults are injected in this process
        "cache_memory_limit_mb": 0.02 if mode == "hybrid" else 64,
        "stop_timeout_s": 2,
    }
    model: dict[str, dict[str, bytes]] = {}
    version = 0
    eng = Engine(Settings(**conf))
    await eng.start()

    async def check() -> None:
        assert set(eng.table_names()) == set(model)
        for name, items in model.items():
            got = await eng.get_many(name, KEYS)
            seen = {it.key: it.value for it in got if it is not None}
            assert seen == items, (name, seen, items)

    try:
        for op in ops_list:
            kind = op[0]
            if kind == "log_fails":
                faults.log, faults.disk_full = op[1], op[2]
            elif kind == "store_fails":
                faults.store = op[1]
            elif kind == "push":
                name, keys = op[1], op[2]
                version += 1
                value = msgpack.packb([version, bytes(2000)])  # the hybrid cache evicts
                with contextlib.suppress(*REFUSED, TableNotFound):
                    await eng.push(name, [NewItem(k, value, 1.0) for k in keys])
                    model[name].update(dict.fromkeys(keys, value))
            elif kind == "delete":
                name, keys = op[1], op[2]
                with contextlib.suppress(*REFUSED, TableNotFound):
                    await eng.delete(name, keys)
                    for k in keys:
                        model[name].pop(k, None)
            elif kind == "create":
                with contextlib.suppress(*REFUSED, TableExists):
                    await eng.create_table(op[1], TableConfig())
                    model.setdefault(op[1], {})
            elif kind == "drop":
                with contextlib.suppress(*REFUSED, TableNotFound):
                    await eng.drop_table(op[1])
                    del model[op[1]]
            elif kind == "checkpoint":
                with contextlib.suppress(*REFUSED, TimeoutError):
                    await asyncio.wait_for(eng.flush(), 2)
            elif kind == "restart":
                faults.log = faults.store = False
                await eng.stop()
                eng = Engine(Settings(**conf))
                await eng.start()
            assert eng.alive
            await check()
        faults.log = faults.store = False
        await eng.stop()
        eng = Engine(Settings(**conf))
        await eng.start()
        await check()
    finally:
        faults.log = faults.store = False
        await eng.stop()


@pytest.mark.parametrize("mode", ["hybrid", "memory", "disk"])
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops_list=st.lists(ops, min_size=1, max_size=30))
def test_no_answered_write_lost_and_no_refused_write_applied(
    mode: str, ops_list: list[tuple[Any, ...]], faults: Faults
) -> None:
    note(f"ops: {ops_list}")
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_in_time(run(ops_list, mode, Path(tmp) / "data", faults)))


async def _in_time(work: Any) -> None:
    """Run ``work``; a hang fails the example with every task's stack instead of waiting
    forever."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=120)
    if not done:
        stacks = []
        for other in asyncio.all_tasks():
            if other is not asyncio.current_task():
                frames = other.get_stack(limit=12)
                where = " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in frames)
                stacks.append(f"{other.get_name()}: {where}")
        task.cancel()
        raise AssertionError("hung:\n" + "\n".join(stacks))
    task.result()
