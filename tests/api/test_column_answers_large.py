"""Columnar answers of large values (64 KiB and more), stacked from a slice of each value
rather than a joined copy, are the same as the decoded values', bit for bit, and every
array's data starts at a multiple of 8 in the answer."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from rlreplay.app.api.column_answers import ALIGNMENT, _entries, aligned_array_head
from rlreplay.app.api.gathered_writes import AnswerPieces
from rlreplay.app.tables.stacking import ROW_SLICES_BYTES, RowSlices, stack_values
from rlreplay.clients.columns import decode_views
from rlreplay.wire.codec import packb, unpackb
from rlreplay.wire.errors import ValidationFailed

N = 5


def _values(rng: np.random.Generator, width: int = 64 << 10) -> list[dict[str, object]]:
    return [
        {
            "obs": rng.integers(0, 256, (width // 64, 64), dtype=np.uint8),
            "reward": float(rng.standard_normal()),
            "step": int(rng.integers(2**33, 2**40)),  # one msgpack form for all
            "done": bool(i % 2),
            "logp": rng.standard_normal(333).astype(">f4"),
        }
        for i in range(N)
    ]


def _joined(body: memoryview | AnswerPieces) -> bytes:
    return body.join() if isinstance(body, AnswerPieces) else bytes(body)


def _answer(values: list[dict[str, object]]) -> dict[str, object]:
    keys = [f"k{i}" for i in range(len(values))]
    columns = stack_values(keys, [packb(v) for v in values])
    body = _entries([("keys", keys), ("columns", columns)])
    answer = unpackb(_joined(body))
    assert isinstance(answer, dict)
    return answer


def test_large_values_stack_from_their_slices_bit_exactly() -> None:
    values = _values(np.random.default_rng(1))
    keys = [f"k{i}" for i in range(N)]
    columns = stack_values(keys, [packb(v) for v in values])
    assert type(columns["obs"].data) is RowSlices  # not a joined copy
    got = _answer(values)["columns"]
    assert isinstance(got, dict)
    for name in ("obs", "logp"):
        dtype = np.asarray(values[0][name]).dtype
        want = np.stack([v[name] for v in values]).astype(dtype)  # type: ignore[arg-type]
        assert got[name].dtype == dtype and got[name].tobytes() == want.tobytes()
    assert got["reward"].tolist() == [v["reward"] for v in values]
    assert got["step"].tolist() == [v["step"] for v in values]
    assert got["done"].tolist() == [v["done"] for v in values]
    assert columns["obs"].contiguous() == np.stack([v["obs"] for v in values]).tobytes()  # type: ignore[arg-type]


def test_large_values_are_sent_from_where_they_lie() -> None:
    values = _values(np.random.default_rng(5))
    stored = [packb(v) for v in values]
    keys = [f"k{i}" for i in range(N)]
    body = _entries([("keys", keys), ("columns", stack_values(keys, stored))])
    assert isinstance(body, AnswerPieces)
    lying = {id(piece.obj) for piece in body.pieces if isinstance(piece, memoryview)}
    assert {id(value) for value in stored} <= lying  # slices of the stored values
    assert len(body) == len(body.join())


def test_a_large_value_laid_out_otherwise_is_decoded_instead() -> None:
    rng = np.random.default_rng(2)
    values = _values(rng)
    odd = dict(values[3])
    odd["obs"] = np.asarray(odd["obs"]).reshape(64, -1)  # same bytes, another shape
    values[3] = odd
    keys = [f"k{i}" for i in range(N)]
    with pytest.raises(ValidationFailed, match="obs"):
        stack_values(keys, [packb(v) for v in values])
    values[3]["obs"] = np.asarray(odd["obs"]).astype(np.int8)  # another dtype, same size
    with pytest.raises(ValidationFailed, match="obs"):
        stack_values(keys, [packb(v) for v in values])


@pytest.mark.parametrize("width", [1024, ROW_SLICES_BYTES, 64 << 10])
def test_every_array_starts_aligned_in_the_answer(width: int) -> None:
    values = _values(np.random.default_rng(3), width)
    keys = [f"k{i}" for i in range(N)]
    columns = stack_values(keys, [packb(v) for v in values])
    body = bytearray(
        _joined(_entries([("keys", keys), ("priorities", np.ones(N)), ("columns", columns)]))
    )
    answer = decode_views(body)
    base = np.frombuffer(body, np.uint8).ctypes.data
    for column in [answer["priorities"], *answer["columns"].values()]:
        assert column.base is not None  # a view of the body, not a copy
        assert (column.ctypes.data - base) % ALIGNMENT == 0


@pytest.mark.parametrize("offset", range(ALIGNMENT))
@pytest.mark.parametrize("shape", [(1,), (127, 3), (200, 5000), (70000,), (3, 2, 2)])
def test_aligned_heads_decode_as_the_shortest_form(offset: int, shape: tuple[int, ...]) -> None:
    data = np.arange(int(np.prod(shape)), dtype="<i4").reshape(shape)
    head = aligned_array_head("<i4", shape, data.nbytes, offset)
    assert (offset + len(head)) % ALIGNMENT == 0
    decoded = unpackb(head + data.tobytes())
    assert decoded.dtype == data.dtype and np.array_equal(decoded, data)


def test_long_rows_of_varying_length_are_gathered_as_they_lie() -> None:
    rng = np.random.default_rng(4)
    tokens = [rng.integers(0, 2**31 - 1, int(n), dtype=np.int32) for n in (5000, 9000, 4097)]
    values = [{"tokens": t, "logp": t.astype(np.float32)} for t in tokens]
    keys = [f"k{i}" for i in range(len(values))]
    columns = stack_values(keys, [packb(v) for v in values])
    assert type(columns["tokens"].data) is RowSlices
    got = _answer(values)["columns"]
    assert isinstance(got, dict)
    assert got["tokens"].tobytes() == np.concatenate(tokens).tobytes()
    assert got["logp"].tobytes() == np.concatenate(tokens).astype(np.float32).tobytes()
    assert got["tokens.cu_seqlens"].tolist() == [0, 5000, 14000, 18097]


async def test_a_connection_without_gathered_writes_gets_the_joined_answer(
    client: httpx.AsyncClient,
) -> None:
    """In process (no httptools connection), the same bytes arrive in one piece."""
    values = _values(np.random.default_rng(6))
    items = [{"key": f"k{i}", "value": v} for i, v in enumerate(values)]
    headers = {"content-type": "application/msgpack", "accept": "application/msgpack"}
    r = await client.post(
        "/v1/tables/default/items", content=packb({"items": items, "wait": True}), headers=headers
    )
    assert r.status_code == 200, r.text
    body = {"keys": [f"k{i}" for i in range(N)], "layout": "columns"}
    r = await client.post("/v1/tables/default/items:batchGet", content=packb(body), headers=headers)
    assert r.status_code == 200
    got = unpackb(r.content)["columns"]
    assert got["obs"].tobytes() == np.stack([v["obs"] for v in values]).tobytes()  # type: ignore[arg-type]
