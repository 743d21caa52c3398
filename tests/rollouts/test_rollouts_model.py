"""Random interleavings of pushes, patches, claims, acks, releases, lease expiries, policy
versions, deletes and restarts against a plain model of a rollout table."""

from __future__ import annotations

import asyncio
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.wire.errors import LeaseNotFound, VersionConflict
from tests.engine.conftest import crash

KEYS = [f"k{i}" for i in range(6)]
TASKS = ["ref", "trainer"]
FIELDS = ["f1", "f2"]
STALENESS = 1


@dataclass
class ModelItem:
    order: int
    version: int
    fields: set[str]
    value: dict[str, Any]
    acked: set[str] = field(default_factory=set)


@dataclass
class ModelLease:
    task: str
    held: dict[str, int]  # key -> order of the item handed out
    acked: set[str] = field(default_factory=set)


class RolloutMachine(RuleBasedStateMachine):
    """The engine and the model, step by step; each claim compares what they hand out."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = tempfile.TemporaryDirectory()
        self.engine: Engine | None = None
        self.items: dict[str, ModelItem] = {}
        self.leases: dict[str, ModelLease] = {}
        self.next_order = 0
        self.version = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    @initialize(mode=st.sampled_from(["memory", "hybrid", "disk"]))
    def start(self, mode: str) -> None:
        self.mode = mode
        self.engine = self._engine()
        self.run(self.engine.start())
        config = TableConfig.model_validate({"max_staleness": STALENESS})
        self.run(self.engine.create_table("t", config))

    def _engine(self) -> Engine:
        return Engine(Settings(data_dir=Path(self.dir.name), io_threads=1, storage_mode=self.mode))

    def teardown(self) -> None:
        if self.engine is not None:
            self.run(self.engine.stop())
        self.loop.close()
        self.dir.cleanup()

    @property
    def e(self) -> Engine:
        assert self.engine is not None
        return self.engine

    def _forget_instance(self, key: str) -> None:
        for lease in self.leases.values():
            lease.held.pop(key, None)

    @rule(key=st.sampled_from(KEYS), with_f1=st.booleans(), version=st.integers(0, 4))
    def push(self, key: str, with_f1: bool, version: int) -> None:
        value: dict[str, Any] = {"base": key}
        if with_f1:
            value["f1"] = 1
        self.run(self.e.push("t", [NewItem(key, msgpack.packb(value), 1.0, None, version)]))
        if version < self.version - STALENESS:
            return  # stale on arrival: dropped
        self._forget_instance(key)
        self.items[key] = ModelItem(self.next_order, version, set(value), value)
        self.next_order += 1

    @rule(key=st.sampled_from(KEYS), name=st.sampled_from(FIELDS), x=st.integers(0, 9))
    def patch(self, key: str, name: str, x: int) -> None:
        answer = self.run(self.e.patch("t", [(key, msgpack.packb({name: x}))]))
        item = self.items.get(key)
        assert answer["missing"] == (item is None)
        if item is not None:
            item.fields.add(name)
            item.value[name] = x

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key: str) -> None:
        self.run(self.e.delete("t", [key]))
        if self.items.pop(key, None) is not None:
            self._forget_instance(key)

    @rule(
        task=st.sampled_from(TASKS),
        want=st.lists(st.sampled_from(FIELDS), unique=True, max_size=2),
        n=st.integers(1, 4),
    )
    def claim(self, task: str, want: list[str], n: int) -> None:
        leased = {
            (k, o)
            for lease in self.leases.values()
            if lease.task == task
            for k, o in lease.held.items()
        }
        ready = sorted(
            (item.order, key)
            for key, item in self.items.items()
            if task not in item.acked
            and (key, item.order) not in leased
            and set(want) <= item.fields
        )
        expected = [key for _, key in ready[:n]]
        lease, got = self.run(
            self.e.claim("t", task, n, fields=want or None, wait_ms=0, partial=True)
        )
        assert [it.key for it in got] == expected
        for it in got:
            value = msgpack.unpackb(it.value)
            full = self.items[it.key].value
            assert value == ({f: full[f] for f in want} if want else full)
        if lease is not None:
            self.leases[lease.id] = ModelLease(task, {k: self.items[k].order for k in expected})

    def _lease_ids(self) -> list[str]:
        return sorted(self.leases)

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        lease_id = data.draw(st.sampled_from(self._lease_ids()))
        lease = self.leases[lease_id]
        count = self.run(self.e.ack("t", lease_id))
        newly = {k for k, o in lease.held.items() if k in self.items and self.items[k].order == o}
        for key in newly:
            self.items[key].acked.add(lease.task)
        lease.acked |= newly
        lease.held = {}
        assert count == len(lease.acked)

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease_id = data.draw(st.sampled_from(self._lease_ids()))
        self.run(self.e.release("t", lease_id))
        self.leases[lease_id].held = {}

    @rule()
    def expire(self) -> None:
        self.e.expire_leases(before=math.inf)
        gone = list(self.leases)
        self.leases = {}
        for lease_id in gone[:1]:
            with pytest.raises(LeaseNotFound):
                self.run(self.e.ack("t", lease_id))

    @rule(step=st.integers(-1, 2))
    def set_version(self, step: int) -> None:
        target = self.version + step
        if target < 0:
            return
        if step < 0:
            with pytest.raises(VersionConflict):
                self.run(self.e.set_version("t", target))
            return
        answer = self.run(self.e.set_version("t", target))
        self.version = target
        for key in [k for k, it in self.items.items() if it.version < target - STALENESS]:
            del self.items[key]
            self._forget_instance(key)
        assert answer["version"] == target

    @rule()
    def restart(self) -> None:
        self.run(self.e.stop())
        self.engine = self._engine()
        self.run(self.engine.start())
        self.leases = {}  # leases live in memory: every unacknowledged item is ready again

    @rule()
    def checkpoint(self) -> None:
        self.run(self.e.flush())  # as the writer takes one when the log grows

    @rule()
    def crash(self) -> None:
        self.run(crash(self.e))  # no final checkpoint: the next start replays the log
        self.engine = self._engine()
        self.run(self.engine.start())
        self.leases = {}

    @invariant()
    def same_items(self) -> None:
        if self.engine is None:
            return
        got = self.run(self.e.get_many("t", KEYS))
        for key, item in zip(KEYS, got, strict=True):
            expected = self.items.get(key)
            if expected is None:
                assert item is None, key
            else:
                assert item is not None, key
                assert msgpack.unpackb(item.value) == expected.value
                assert item.version == expected.version


RolloutMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_rollout_tables_match_a_plain_model = RolloutMachine.TestCase
