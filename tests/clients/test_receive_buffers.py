"""Columnar answers are read into reused buffers and handed out as views of them: a buffer
is never written again while anything made from it is alive, and is reused once nothing is;
the pool keeps a bounded number of buffers."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing

import numpy as np
import pytest

from rlreplay import ReplayClient
from rlreplay.wire.buffer_pool import BufferPool
from tests.live import running_server

pytest.importorskip("fastapi")

ROWS, WIDTH = 8, 64 * 1024  # 512 KiB answers: past the pool's 256 KiB floor


def test_a_buffer_in_use_is_not_handed_out_and_a_free_one_is_reused() -> None:
    pool = BufferPool(max_buffers=2, min_bytes=16)
    first = np.frombuffer(pool.take(100), np.uint8)
    first[:] = 1
    second = np.frombuffer(pool.take(100), np.uint8)
    second[:] = 2
    assert (first == 1).all()  # not the same memory
    address = first.ctypes.data
    del first
    gc.collect()
    again = np.frombuffer(pool.take(80), np.uint8)
    assert again.ctypes.data == address  # the free one, reused
    assert (second == 2).all()


def test_the_pool_stays_bounded_when_every_buffer_is_held() -> None:
    pool = BufferPool(max_buffers=3, min_bytes=16)
    held = [np.frombuffer(pool.take(1000), np.uint8) for _ in range(10)]
    for i, array in enumerate(held):
        array[:] = i
    assert pool.held_bytes() <= 3 * 1000
    assert all((array == i).all() for i, array in enumerate(held))  # none overwritten
    small = pool.take(8)  # under min_bytes: a fresh buffer, not kept
    assert len(small) == 8 and pool.held_bytes() <= 3 * 1000


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    flags = ("--storage-mode", "memory", "--durability", "none")
    with running_server(tmp_path_factory.mktemp("buffers"), *flags) as server:
        yield server.url


@pytest.fixture
async def rb(server_url: str) -> AsyncIterator[ReplayClient]:
    async with ReplayClient(server_url) as client:
        yield client


async def _fill(rb: ReplayClient, table: str, value: int) -> list[str]:
    keys = [f"{table}-{i}" for i in range(ROWS)]
    columns = {"x": np.full((ROWS, WIDTH), value, dtype=np.uint8)}
    await rb.push_columns(table, keys, columns, wait=True)
    return keys


async def test_a_batch_held_is_never_overwritten_by_later_answers(rb: ReplayClient) -> None:
    await rb.create_table("held")
    await rb.create_table("other")
    held_keys = await _fill(rb, "held", 7)
    other_keys = await _fill(rb, "other", 9)
    held = await rb.get_many("held", held_keys, layout="columns")
    assert held["x"].base is not None  # a view of the receive buffer, not a copy
    for _ in range(12):  # more answers than the pool keeps buffers
        other = await rb.get_many("other", other_keys, layout="columns")
        assert (other["x"] == 9).all()
        sampled = await rb.sample("other", ROWS, layout="columns")
        assert (sampled["x"] == 9).all()
    assert (held["x"] == 7).all()
    held["x"][0, 0] = 1  # the caller's to write
    assert held["x"][0, 0] == 1


async def test_a_released_batch_s_buffer_is_reused(rb: ReplayClient) -> None:
    await rb.create_table("reuse")
    keys = await _fill(rb, "reuse", 3)
    first = await rb.get_many("reuse", keys, layout="columns")
    address = first["x"].ctypes.data
    del first
    gc.collect()
    again = await rb.get_many("reuse", keys, layout="columns")
    assert again["x"].ctypes.data == address
    assert (again["x"] == 3).all()


def test_a_widened_pool_keeps_more_buffers_then_what_it_kept_before() -> None:
    pool = BufferPool(max_buffers=1, min_bytes=16)
    with pool.widened(3):
        held = [pool.take(1000) for _ in range(3)]
        assert pool.held_bytes() == 3 * 1000  # all three kept
        addresses = {np.frombuffer(view, np.uint8).ctypes.data for view in held}
        del held
        gc.collect()
        again = [pool.take(1000) for _ in range(3)]  # the same three, reused
        assert {np.frombuffer(view, np.uint8).ctypes.data for view in again} == addresses
    assert pool.held_bytes() == 1000


async def test_a_stream_with_many_answers_in_flight_reuses_its_buffers(
    rb: ReplayClient,
) -> None:
    await rb.create_table("streamed")
    await _fill(rb, "streamed", 5)
    pool = rb._requester._lean._buffers  # type: ignore[union-attr]
    addresses: set[int] = set()
    async with aclosing(rb.stream("streamed", batch_size=ROWS, layout="columns", prefetch=6)) as s:
        n = 0
        async for batch in s:
            assert (batch["x"] == 5).all()
            addresses.add(batch["x"].ctypes.data)
            del batch
            n += 1
            if n == 40:
                break
        assert pool.held_bytes() > 4 * ROWS * WIDTH  # widened past the default 4 meanwhile
    # 6 in flight, one held, one let go: more distinct buffers would mean fresh ones
    assert len(addresses) <= 8
    assert pool.held_bytes() <= 4 * (ROWS * WIDTH + 4096)
