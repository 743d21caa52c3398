"""Masks of names in growing 2-D columns, against plain sets of names; a table saved by a
version that tracked at most 64 field names learns its items' fields again."""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.app.tables.name_masks import Names, row_mask, row_masks, set_row, set_rows, widened
from rlreplay.app.tables.table import Table

NAMES = [f"n{i}" for i in range(200)]


@given(st.lists(st.lists(st.sampled_from(NAMES), max_size=12), min_size=1, max_size=30))
def test_rows_hold_the_names_they_were_given(rows: list[list[str]]) -> None:
    column = np.zeros((len(rows), 1), dtype=np.uint64)

    def widen(words: int) -> None:
        nonlocal column
        column = widened(column, words)

    names = Names(widen)
    for slot, row in enumerate(rows):
        masks = [names.mask(row)]  # may widen: before the column is read
        if slot % 2:
            set_rows(column, [slot], masks)
        else:
            set_row(column, slot, masks[0])
    assert column.shape[1] == max(1, (len(names) + 63) // 64)
    for slot, row in enumerate(rows):
        assert set(names.names(row_mask(column, slot))) == set(row)
    assert [set(names.names(m)) for m in row_masks(column, list(range(len(rows))))] == [
        set(row) for row in rows
    ]


def test_names_are_numbered_without_a_limit() -> None:
    widths: list[int] = []
    names = Names(widths.append)
    bits = [names.bit(name) for name in NAMES]
    assert bits == [1 << i for i in range(len(NAMES))]
    assert widths == [2, 3, 4]
    assert names.names(bits[70] | bits[199] | bits[0]) == ["n0", "n70", "n199"]
    assert names.known("n150") == 1 << 150 and names.known("nope") is None


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
        t.field_mask[:] = 0
        for slot in range(3):
            set_row(t.field_mask, slot, r.fields.mask([f"f{j}" for j in range(64)]))
        lease, items = await engine.claim("t", "trainer", 3, fields=["f70"], wait_ms=0)
        assert lease is not None and [it.key for it in items] == ["r0", "r1", "r2"]
        assert not r.relearn and t.state_dict()["rollouts"]["names_whole"] is True
    finally:
        await engine.stop()
