"""Pushes queued behind each other are applied as one op, with the result of applying them
in turn: the same items, values, priorities, order and trims, each item with its own push's
time and log position (a crash after partial checkpoints loses nothing)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from rlreplay.app.engine.admission import Admission
from rlreplay.app.engine.engine import Engine
from rlreplay.app.engine.feed import read_changes
from rlreplay.app.tables.config import RemoverSpec, TableConfig
from rlreplay.app.writer import task_processor
from rlreplay.app.writer.ops import CheckpointOp, PutOp
from rlreplay.app.writer.task_processor import TaskProcessor
from tests.engine.conftest import crash, engine_with_table, item, make_settings

MODES = ["memory", "disk", "hybrid"]
JOIN_PUSHES = TaskProcessor.join_pushes


def count_joins(monkeypatch: pytest.MonkeyPatch, *, enabled: bool = True) -> list[int]:
    """Records how many pushes each applied push op stands for (joining off: always 1)."""
    joined: list[int] = []

    def spy(self: TaskProcessor, op: PutOp) -> PutOp:
        out = JOIN_PUSHES(self, op) if enabled else op
        joined.append(len(out.parts) or 1)
        return out

    monkeypatch.setattr(TaskProcessor, "join_pushes", spy)
    return joined


def pushes_of(n_pushes: int, per_push: int) -> list[list[Any]]:
    """Pushes of distinct keys, each with its own priorities."""
    return [
        [item(f"p{p}/{i}", {"p": p, "i": i}, float(p * per_push + i)) for i in range(per_push)]
        for p in range(n_pushes)
    ]


async def table_state(eng: Engine, table: str) -> dict[str, tuple[Any, float, int, int]]:
    """Key -> (value, priority, insertion rank, times sampled), as readers see it."""
    await eng.flush()
    t = eng._table(table)
    slots = np.fromiter(t.index.values(), dtype=np.int64, count=len(t.index))
    ranks = {int(s): rank for rank, s in enumerate(slots[np.argsort(t.order[slots])].tolist())}
    keys = sorted(t.index)
    got = await eng.get_many(table, keys)
    out = {}
    for key, g in zip(keys, got, strict=True):
        assert g is not None
        slot = t.index[key]
        out[key] = (msgpack.unpackb(g.value), g.priority, ranks[slot], g.times_sampled)
    return out


async def push_all_queued(eng: Engine, table: str, pushes: list[list[Any]]) -> None:
    """Pushes that all reach the writer's queue before it applies the first."""
    await asyncio.gather(*(eng.push(table, items) for items in pushes))


@pytest.fixture
def joined(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return count_joins(monkeypatch)


@pytest.fixture
async def eng(tmp_path: Path) -> AsyncIterator[Engine]:
    """A hybrid engine with an uncapped table ``t``."""
    async with engine_with_table(make_settings(tmp_path / "d")) as engine:
        yield engine


@pytest.mark.parametrize("mode", MODES)
async def test_queued_pushes_are_joined_with_the_result_of_one_by_one(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = TableConfig(max_size=100, remover=RemoverSpec(type="fifo"))
    states = []
    for enabled in (False, True):
        joined = count_joins(monkeypatch, enabled=enabled)
        eng = Engine(make_settings(tmp_path / f"d{enabled}", storage_mode=mode))
        await eng.start()
        try:
            await eng.create_table("t", config)
            await push_all_queued(eng, "t", pushes_of(20, 16))
            states.append(await table_state(eng, "t"))
            stats = eng.describe("t")["stats"]
            assert (stats["size"], stats["inserts"], stats["deletes"]) == (100, 320, 220)
            assert stats["pending_ops"] == 0
        finally:
            await eng.stop()
        assert max(joined) > 1 if enabled else max(joined) == 1
    assert states[0] == states[1]
    # FIFO kept the newest 100 keys, in push order
    newest = [f"p{p}/{i}" for p in range(20) for i in range(16)][-100:]
    assert sorted(states[1], key=lambda k: states[1][k][2]) == newest


async def test_each_item_keeps_its_own_push_time_and_log_position(
    eng: Engine, joined: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    seqs: dict[str, int] = {}
    times: dict[str, float] = {}
    real_push = Admission._push

    async def remember(self: Admission, table: str, items: Any, *args: Any) -> int:
        n = await real_push(self, table, items, *args)
        entries = eng.state.tables[table].pending.entries
        for it in items:
            seq, _, at = entries.get(it.key, (0, None, 0.0))
            seqs.setdefault(it.key, seq)
            times.setdefault(it.key, at)
        return n

    monkeypatch.setattr(Admission, "_push", remember)
    await push_all_queued(eng, "t", pushes_of(8, 4))
    await eng.flush()
    assert max(joined) > 1
    t = eng._table("t")
    known = [key for key in seqs if seqs[key]]  # those still pending when answered
    assert known
    for key in known:
        assert t.put_seq[t.index[key]] == seqs[key]
        assert t.inserted_at[t.index[key]] == times[key]


@pytest.mark.parametrize("mode", MODES)
async def test_joined_pushes_survive_a_crash_after_partial_checkpoints(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    joined = count_joins(monkeypatch)
    settings = make_settings(tmp_path / "d", storage_mode=mode)
    eng = Engine(settings)
    await eng.start()
    await eng.create_table("t", TableConfig())
    pushes = pushes_of(12, 8)
    await push_all_queued(eng, "t", pushes[:4])
    await eng.flush()
    await eng._writer().checkpoint(full=False)  # cut: the log before the first pushes goes
    await push_all_queued(eng, "t", pushes[4:])
    await eng.flush()
    await eng._writer().checkpoint(full=False)
    before = await table_state(eng, "t")
    await crash(eng)
    assert max(joined) > 1

    again = Engine(settings)
    await again.start()
    try:
        assert await table_state(again, "t") == before
        assert len(before) == 96
    finally:
        await again.stop()


async def test_a_key_pushed_again_stops_the_join(eng: Engine, joined: list[int]) -> None:
    pushes = [
        [item("a", 1), item("b", 1)],
        [item("c", 2)],
        [item("b", 3), item("d", 3)],  # b again: applied after the two before it
        [item("a", 4, 7.0)],
    ]
    await push_all_queued(eng, "t", pushes)
    state = await table_state(eng, "t")
    assert {k: v[:2] for k, v in state.items()} == {
        "a": (4, 7.0),
        "b": (3, 1.0),
        "c": (2, 1.0),
        "d": (3, 1.0),
    }
    assert [k for k in sorted(state, key=lambda k: state[k][2])] == ["c", "b", "d", "a"]
    assert sum(joined) == len(pushes)  # how they joined depends on the log's timing


async def test_joined_pushes_answer_every_waiting_caller(eng: Engine, joined: list[int]) -> None:
    counts = await asyncio.gather(*(eng.push("t", items, wait=True) for items in pushes_of(10, 3)))
    assert counts == [3] * 10
    assert max(joined) > 1
    assert eng.describe("t")["stats"]["size"] == 30


async def test_the_change_feed_gets_one_batch_per_joined_push(
    eng: Engine, joined: list[int]
) -> None:
    first = await read_changes(eng.core, "t", 0, 1000, 0.0)  # starts the feed
    await push_all_queued(eng, "t", pushes_of(6, 5))
    await eng.flush()
    assert max(joined) > 1
    events = (await read_changes(eng.core, "t", first.seq, 1000, 0.0)).events
    assert [e.key for e in events] == [f"p{p}/{i}" for p in range(6) for i in range(5)]
    t = eng._table("t")
    for e in events:
        assert e.op == "put"
        assert e.inserted_at == t.inserted_at[t.index[e.key]]


def test_only_durable_pushes_to_one_table_with_keys_of_their_own_join(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What join_pushes leaves queued: another table's push, a refused one, one not yet
    durable, one with a key already in the join, and anything past the size bound."""
    from collections import deque
    from types import SimpleNamespace

    from rlreplay.app.writer import task_processor as tp

    a, b = SimpleNamespace(changes=None), SimpleNamespace(changes=None)
    wal = SimpleNamespace(durable_lsn=10, refusal=lambda seq: None)

    def put(seq: int, table: Any, keys: str, *, refused: bool = False) -> PutOp:
        items = [item(k) for k in keys]
        return PutOp(seq, table=table, items=items, inserted_at=float(seq), refused=refused)

    def join(first: PutOp, queued: list[Any]) -> tuple[PutOp, list[Any]]:
        processor = tp.TaskProcessor.__new__(tp.TaskProcessor)
        processor.urgent = deque(queued)
        processor._state = SimpleNamespace(wal=wal, queued_items=0, queued_bytes=0)
        return processor.join_pushes(first), list(processor.urgent)

    other = put(3, b, "y")
    got, left = join(put(1, a, "ab"), [put(2, a, "c"), other, put(4, a, "d")])
    assert [p.seq for p in got.parts] == [1, 2] and left[0] is other
    assert [it.key for it in got.items] == ["a", "b", "c"] and got.seq == 2

    refused = put(2, a, "c", refused=True)
    got, left = join(put(1, a, "a"), [refused])
    assert not got.parts and left == [refused]

    late = put(11, a, "c")  # past the durable position: may still be refused
    got, left = join(put(1, a, "a"), [late])
    assert not got.parts and left == [late]

    again = put(3, a, "bd")  # b again: it waits for the join before it to be applied
    got, left = join(put(1, a, "ab"), [put(2, a, "c"), again])
    assert [p.seq for p in got.parts] == [1, 2] and left == [again]
    got, left = join(put(1, a, "aa"), [put(2, a, "c")])  # a key twice in one push
    assert not got.parts

    checkpoint = CheckpointOp(0)
    got, left = join(put(1, a, "a"), [checkpoint, put(2, a, "b")])
    assert not got.parts and left[0] is checkpoint

    big = [put(i, a, [f"k{i}/{j}" for j in range(100)]) for i in range(2, 10)]  # type: ignore[arg-type]
    monkeypatch.setattr(tp, "JOIN_ITEMS", 250)
    got, left = join(put(1, a, "a"), big)
    assert len(got.items) >= 250 and len(left) == len(big) - (len(got.parts) - 1)
    assert left  # the bound left some queued


async def test_the_writer_yields_to_the_event_loop_once_its_time_slice_is_spent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # every route waits while the writer applies: past its slice it lets the loop turn,
    # however few ops that was (here each op spends it)
    count_joins(monkeypatch, enabled=False)
    monkeypatch.setattr(task_processor, "YIELD_AFTER_S", 0.0)
    events: list[str] = []
    apply = TaskProcessor.apply

    async def spy(self: TaskProcessor, op: Any, **kwargs: Any) -> None:
        await apply(self, op, **kwargs)
        if type(op) is PutOp:
            events.append("applied")

    monkeypatch.setattr(TaskProcessor, "apply", spy)
    settings = make_settings(tmp_path / "d", storage_mode="memory", durability="none")
    async with engine_with_table(settings) as eng:
        stop = asyncio.Event()

        async def turns() -> None:
            while not stop.is_set():
                events.append("turn")
                await asyncio.sleep(0)

        pushes = [eng.push("t", items) for items in pushes_of(20, 4)]  # all queued at once
        ticker = asyncio.create_task(turns())
        await asyncio.gather(*pushes)
        await eng.flush()
        stop.set()
        await ticker
    applied = [i for i, e in enumerate(events) if e == "applied"]
    assert len(applied) == 20
    # the loop turned between any two ops the writer applied
    assert all("turn" in events[a:b] for a, b in itertools.pairwise(applied))
