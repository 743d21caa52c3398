"""Masks of names in growing 2-D columns, against plain sets of names; a table saved by a
version that tracked at most 64 field names learns its items' fields again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.app.tables.name_masks import Names, SlotMasks
from rlreplay.app.tables.table import Table

NAMES = [f"n{i}" for i in range(200)]


class _Table:
    """What :class:`SlotMasks` needs of a table: a column it may replace as it grows."""

    def __init__(self, n: int) -> None:
        self.masks = np.zeros(n, dtype=np.uint64)


ops = st.lists(
    st.tuples(
        st.sampled_from(["set", "set_many", "clear", "add"]),
        st.lists(st.integers(0, 19), min_size=1, max_size=5, unique=True),
        st.lists(st.sampled_from(NAMES), max_size=8),
    ),
    max_size=40,
)


@given(ops)
def test_slot_masks_hold_the_names_they_were_given(steps: list[Any]) -> None:
    table = _Table(20)
    names = Names()
    masks = SlotMasks(table, "masks")
    model: dict[int, set[str]] = {slot: set() for slot in range(20)}
    for op, slots, given_names in steps:
        at = np.asarray(slots, dtype=np.int64)
        if op == "set":
            masks.set(slots[0], names.mask(given_names))
            model[slots[0]] = set(given_names)
        elif op == "set_many":
            masks.set_many(at, [names.mask(given_names[i:]) for i in range(len(slots))])
            for i, slot in enumerate(slots):
                model[slot] = set(given_names[i:])
        elif op == "clear":
            masks.clear(at, slots)
            for slot in slots:
                model[slot] = set()
        elif given_names:
            masks.add(at, names.bit(given_names[0]))
            for slot in slots:
                model[slot].add(given_names[0])
        if op == "set" and slots[0] % 3 == 0:  # the table grows its column meanwhile
            grown = np.zeros(len(table.masks) + 4, dtype=np.uint64)
            grown[: len(table.masks)] = table.masks
            table.masks = grown
    everyone = list(range(20))
    assert [set(names.names(m)) for m in masks.get_many(everyone)] == [model[s] for s in everyone]
    assert [set(names.names(masks.get(s))) for s in everyone] == [model[s] for s in everyone]
    assert masks.empty(20).tolist() == [not model[s] for s in everyone]
    for name in NAMES[:3] + NAMES[64:67] + NAMES[150:151]:
        bit = names.known(name)
        if bit is not None:
            assert masks.lacking(20, bit).tolist() == [name not in model[s] for s in everyone]
    # only slots holding a name past the 64th keep more than their column's word
    assert all(more and (more >> 64) for more in masks.high.values())


def test_names_are_numbered_without_a_limit() -> None:
    names = Names()
    bits = [names.bit(name) for name in NAMES]
    assert bits == [1 << i for i in range(len(NAMES))]
    assert names.names(bits[70] | bits[199] | bits[0]) == ["n0", "n70", "n199"]
    assert names.known("n150") == 1 << 150 and names.known("nope") is None
    assert names.known_mask(["n1", "n150"]) == bits[1] | bits[150]
    assert names.known_mask(["n1", "nope"]) is None and "nope" not in names.positions


def _legacy_table(n_names: int) -> Table:
    """A table as a version that kept at most 64 field names saved it: no ``names_whole``
    in its state, items' records listing ``n_names`` names."""
    state = {
        "id": 1,
        "config": TableConfig().to_wire(),
        "rollouts": {"version": 0, "dropped_stale": 0},
    }
    table = Table.from_state_dict("t", state)
    value = msgpack.packb({f"f{j}": j for j in range(100)})
    meta = [None, None, [f"f{j}" for j in range(n_names)], []]
    table.restore([("r0", value, 1.0, 0.0, 0, len(value) + 2, 0, meta)], on_disk=False, fields=[])
    return table


def test_a_table_saved_with_64_names_learns_its_fields_again() -> None:
    full = _legacy_table(64)
    assert full.rollouts.relearn
    assert full.state_dict()["rollouts"]["names_whole"] is False
    fewer = _legacy_table(10)  # below the old limit nothing was dropped
    assert not fewer.rollouts.relearn
    assert fewer.state_dict()["rollouts"]["names_whole"] is True


async def test_a_claim_relearns_the_fields_a_legacy_table_lost(tmp_path: Path) -> None:
    engine = Engine(Settings(data_dir=tmp_path, io_threads=1, storage_mode="memory"))
    await engine.start()
    try:
        await engine.create_table("t", TableConfig.model_validate({"sampler": {"type": "fifo"}}))
        value = msgpack.packb({f"f{j}": j for j in range(100)})
        await engine.push("t", [NewItem(f"r{i}", value, 1.0) for i in range(3)], wait=True)
        t = engine._table("t")
        # as restored from a version that kept 64 names: the later ones are missing
        r = t.rollouts
        r.learning, r.relearn = None, True
        for slot in range(3):
            r.field_masks.set(slot, r.fields.mask([f"f{j}" for j in range(64)]))
        lease, items = await engine.claim("t", "trainer", 3, fields=["f70"], wait_ms=0)
        assert lease is not None and [it.key for it in items] == ["r0", "r1", "r2"]
        assert not r.relearn and t.state_dict()["rollouts"]["names_whole"] is True
    finally:
        await engine.stop()


async def test_a_claim_for_a_field_no_item_has_waits_for_it_and_numbers_nothing(
    tmp_path: Path,
) -> None:
    engine = Engine(Settings(data_dir=tmp_path, io_threads=1, storage_mode="memory"))
    await engine.start()
    try:
        await engine.create_table("t", TableConfig.model_validate({"sampler": {"type": "fifo"}}))
        await engine.push("t", [NewItem("r0", msgpack.packb({"prompt": 1}), 1.0)], wait=True)
        claim = asyncio.ensure_future(engine.claim("t", "trainer", 1, fields=["late"]))
        await asyncio.sleep(0.2)
        assert not claim.done()
        assert "late" not in engine._table("t").rollouts.fields.positions
        await engine.patch("t", [("r0", msgpack.packb({"late": 2}))], wait=True)
        lease, items = await asyncio.wait_for(claim, 30)
        assert lease is not None and [it.key for it in items] == ["r0"]
        assert msgpack.unpackb(items[0].value) == {"late": 2}
    finally:
        await engine.stop()
