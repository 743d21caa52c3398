"""Items out of columns: both ways of building the values give the client codec's bytes."""

from __future__ import annotations

import math
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlreplay.app.tables import unstacking
from rlreplay.app.tables.unstacking import ColumnIn, unstack_values
from rlreplay.wire.arrays import wire_dtype
from rlreplay.wire.codec import packb

DTYPES = st.sampled_from(["|b1", "|u1", "<i2", ">u4", "<i8", "<f2", ">f4", "<f8", "<c8"])


@st.composite
def columns(draw: st.DrawFn) -> tuple[dict[str, np.ndarray[Any, Any]], int]:
    """Columns of ``n`` items: some wide enough to be joined, some not; 1-D ones too."""
    n = draw(st.integers(min_value=1, max_value=5))
    fields = st.sampled_from(["obs", "act", "r", "é"])
    names = draw(st.lists(fields, min_size=1, max_size=3, unique=True))
    out = {}
    for name in names:
        dtype = np.dtype(draw(DTYPES))
        element = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=40))
        shape = (n, *element)
        size = math.prod(shape) * dtype.itemsize
        raw = draw(st.binary(min_size=size, max_size=size))
        if dtype.kind == "b":
            array = (np.frombuffer(raw, np.uint8) & 1).astype(bool).reshape(shape)
        else:
            array = np.frombuffer(raw, dtype=dtype).reshape(shape)
        if dtype.kind in "fc":
            array = np.nan_to_num(array)  # a NaN's payload is the codec's business, not this
        out[name] = array
    return out, n


def _column_ins(batch: dict[str, np.ndarray[Any, Any]]) -> list[ColumnIn]:
    out = []
    for name, a in batch.items():
        data = np.ascontiguousarray(a).reshape(-1).view(np.uint8).data
        out.append(ColumnIn(name, wire_dtype(a.dtype), a.shape, data))
    return out


@settings(max_examples=150, deadline=None)
@given(case=columns())
def test_joined_and_side_by_side_values_are_the_codecs_bytes(
    case: tuple[dict[str, np.ndarray[Any, Any]], int],
) -> None:
    batch, n = case
    want = [packb({name: a[i] for name, a in batch.items()}) for i in range(n)]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(unstacking, "JOIN_ROW_BYTES", 0)  # joined whenever the rows allow it
        joined = unstack_values(_column_ins(batch), n)
        m.setattr(unstacking, "JOIN_ROW_BYTES", 1 << 62)  # never joined
        side_by_side = unstack_values(_column_ins(batch), n)
    assert joined == want
    assert side_by_side == want


def test_wide_rows_are_joined_and_narrow_ones_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    joined = unstacking._joined

    def counting(parts: Any, n: int) -> list[bytes]:
        calls.append(n)
        return joined(parts, n)

    monkeypatch.setattr(unstacking, "_joined", counting)
    wide = np.arange(3 * 4096, dtype=np.uint8).reshape(3, 4096)
    narrow = np.arange(3 * 8, dtype=np.uint8).reshape(3, 8)
    for batch, expect in (
        ({"obs": wide}, [3]),
        ({"obs": narrow}, []),
        ({"obs": wide, "r": narrow}, [3]),
    ):
        calls.clear()
        values = unstack_values(_column_ins(batch), 3)
        assert values == [packb({k: a[i] for k, a in batch.items()}) for i in range(3)]
        assert calls == expect, batch.keys()


@pytest.mark.parametrize("dtype", [np.longdouble, np.clongdouble])
def test_long_double_scalars_travel_without_their_padding(dtype: Any) -> None:
    """x87 long doubles fill 10 of their 12 or 16 bytes: the rest is whatever memory held,
    and both forms send zeros there, so one number has one encoding."""
    column = np.array([1.5, -2.25], dtype=dtype)
    if np.finfo(dtype).nmant != 63:
        pytest.skip("long double is not x87 extended precision on this machine")
    width = column.dtype.itemsize // (2 if column.dtype.kind == "c" else 1)
    column.view(np.uint8).reshape(-1, width)[:, 10:] = 7
    values = unstack_values(_column_ins({"x": column}), 2)
    for i in range(2):
        assert values[i] == packb({"x": column[i]})
        assert b"\x07" not in values[i][-column.dtype.itemsize :]
