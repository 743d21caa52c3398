"""Columnar answers of values of 4 KiB and more are sent from a slice of each stored value
(no joined copy, no gather into a buffer), bit for bit the values' arrays, and a batchGet
that finds every key takes no step per item to say so."""

from __future__ import annotations

import numpy as np

from rlreplay.app.api.column_answers import FoundColumns, item_columns_msgpack
from rlreplay.app.api.gathered_writes import AnswerPieces
from rlreplay.app.tables.items import ItemBatch
from rlreplay.app.tables.stacking import RowSlices, stack_values
from rlreplay.clients.columns import decode_views
from rlreplay.wire.codec import packb

N = 64


def _batch(values: list[bytes | None]) -> ItemBatch:
    n = len(values)
    return ItemBatch(
        [f"k{i}" for i in range(n)],
        values,
        np.arange(n, dtype=np.float64),
        np.zeros(n),
        np.arange(n, dtype=np.int64),
    )


def _body(answer: memoryview | AnswerPieces) -> bytearray:
    return bytearray(answer.join() if isinstance(answer, AnswerPieces) else answer)


def test_four_kib_values_are_sent_from_where_they_lie_bit_exactly() -> None:
    rows = np.random.default_rng(1).integers(0, 256, (N, 4096), dtype=np.uint8)
    stored = [packb({"x": row, "step": i}) for i, row in enumerate(rows)]
    columns = stack_values([f"k{i}" for i in range(N)], stored)
    assert type(columns["x"].data) is RowSlices
    answer = item_columns_msgpack(FoundColumns(_batch(list(stored))))
    assert isinstance(answer, AnswerPieces)
    lying = {id(piece.obj) for piece in answer.pieces if isinstance(piece, memoryview)}
    assert {id(value) for value in stored} <= lying
    got = decode_views(_body(answer))
    assert got["columns"]["x"].tobytes() == rows.tobytes()
    assert got["columns"]["step"].tolist() == list(range(N))
    assert got["keys"] == [f"k{i}" for i in range(N)] and got["missing"] == []
    assert got["times_sampled"].tolist() == list(range(N))


def test_a_batch_get_with_keys_missing_answers_the_found_ones() -> None:
    rows = np.random.default_rng(2).integers(0, 256, (N, 4096), dtype=np.uint8)
    stored: list[bytes | None] = [packb({"x": row}) for row in rows]
    stored[3] = stored[40] = None
    found = FoundColumns(_batch(stored))
    assert found.missing == ["k3", "k40"]
    got = decode_views(_body(item_columns_msgpack(found)))
    kept = [i for i in range(N) if i not in (3, 40)]
    assert got["keys"] == [f"k{i}" for i in kept]
    assert got["priorities"].tolist() == [float(i) for i in kept]
    assert got["columns"]["x"].tobytes() == rows[kept].tobytes()


def test_small_values_are_still_joined_and_gathered() -> None:
    rows = np.random.default_rng(3).integers(0, 256, (N, 512), dtype=np.uint8)
    stored = [packb({"x": row}) for row in rows]
    answer = item_columns_msgpack(FoundColumns(_batch(list(stored))))
    assert not isinstance(answer, AnswerPieces)
    assert decode_views(_body(answer))["columns"]["x"].tobytes() == rows.tobytes()
