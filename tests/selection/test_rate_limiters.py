"""Rate limiters follow Reverb's rules, and the gate makes calls wait for them (no polling)."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from rlreplay.app.selection.rate_limiters import RateGate, RateLimiter
from rlreplay.app.tables.config import (
    MinSizeLimiter,
    QueueLimiter,
    SampleToInsertRatioLimiter,
    make_rate_limiter,
)
from rlreplay.wire.errors import DeadlineExceeded, TableNotFound, ValidationFailed

SHORT = 0.05  # seconds: long enough for a waiter to block, short enough for a fast suite


def ratio(min_size: int = 1, spi: float = 1.0, error_buffer: float = 100.0) -> RateLimiter:
    return make_rate_limiter(
        SampleToInsertRatioLimiter(
            type="sample_to_insert_ratio",
            min_size_to_sample=min_size,
            samples_per_insert=spi,
            error_buffer=error_buffer,
        )
    )


def queue(size: int) -> RateLimiter:
    return make_rate_limiter(QueueLimiter(type="queue", size=size))


# -- the limiter's arithmetic ------------------------------------------------------------


def test_specs_map_to_reverb_bounds() -> None:
    limiter = ratio(min_size=10, spi=2.0, error_buffer=5.0)
    assert (limiter.samples_per_insert, limiter.min_size_to_sample) == (2.0, 10)
    assert (limiter.min_diff, limiter.max_diff) == (15.0, 25.0)
    q = queue(7)
    assert (q.samples_per_insert, q.min_size_to_sample, q.min_diff, q.max_diff) == (1.0, 1, 0, 7)
    m = make_rate_limiter(MinSizeLimiter(type="min_size", min_size=4))
    assert (m.min_size_to_sample, m.min_diff, m.max_diff) == (4, -math.inf, math.inf)
    none = make_rate_limiter(None)
    assert none.kind == "none" and none.min_size_to_sample == 1


def test_bad_bounds_are_rejected_eagerly() -> None:
    with pytest.raises(ValueError, match=r"samples_per_insert \(0.0\) must be > 0"):
        RateLimiter("x", 0.0, 1, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"min_size_to_sample \(0\) must be >= 1"):
        RateLimiter("x", 1.0, 0, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"min_diff \(2.0\) must be <= max_diff \(1.0\)"):
        RateLimiter("x", 1.0, 1, 2.0, 1.0)


def test_ratio_allows_exactly_its_band() -> None:
    # spi 2, min size 3, error buffer 2: min_diff 4, max_diff 8.
    limiter = ratio(min_size=3, spi=2.0, error_buffer=2.0)
    assert limiter.can_insert(3)  # filling up to min size is free
    assert not limiter.can_insert(5)  # 10 > max_diff 8, and past min size
    limiter.record_inserts(3)  # cursor 6
    assert limiter.samples_allowed(10) == 2  # down to 4 = min_diff
    assert limiter.can_insert(1)  # cursor 8 <= 8
    assert not limiter.can_insert(2)
    limiter.record_samples(2)  # cursor 4
    assert limiter.samples_allowed(10) == 0
    assert limiter.can_insert(2) and not limiter.can_insert(3)


def test_min_size_counts_size_not_inserts() -> None:
    limiter = make_rate_limiter(MinSizeLimiter(type="min_size", min_size=3))
    limiter.record_inserts(3)
    assert limiter.samples_allowed(1000) == 1000
    limiter.record_deletes(1)
    assert limiter.samples_allowed(1) == 0
    assert limiter.samples_allowed(1, size=3) == 1  # a table-supplied size wins


def test_problems_flag_stalling_configurations() -> None:
    assert ratio(min_size=10).problems(max_size=5, max_times_sampled=0) == [
        "sample_to_insert_ratio: min_size_to_sample (10) > max_size (5): the table never "
        "holds enough items, so samples always wait"
    ]
    narrow = ratio(min_size=1, spi=4.0, error_buffer=2.0).problems(None, 0)
    assert len(narrow) == 1 and "error_buffer (2) < max(1, samples_per_insert) (4)" in narrow[0]
    starved = ratio(spi=4.0, error_buffer=10.0).problems(None, 2)
    assert len(starved) == 1 and "max_times_sampled (2)" in starved[0]
    assert "evicts items before they are sampled" in queue(10).problems(5, 1)[0]
    assert ratio(min_size=100, spi=2.0, error_buffer=50).problems(1000, 0) == []
    assert queue(10).problems(10, 1) == []
    assert make_rate_limiter(None).problems(1, 0) == []


def test_state_dict_round_trip() -> None:
    limiter = ratio()
    limiter.record_inserts(5)
    limiter.record_samples(3)
    limiter.record_deletes(1)
    copy = ratio()
    copy.load_state_dict(limiter.state_dict())
    assert (copy.inserts, copy.samples, copy.deletes) == (5, 3, 1)


# -- the gate ------------------------------------------------------------------------------


async def test_ratio_gate_lets_through_exactly_the_allowed_samples_then_blocks() -> None:
    gate = RateGate(ratio(min_size=2, spi=1.0, error_buffer=3.0))  # min_diff -1, max_diff 5
    await gate.acquire_insert(2, SHORT)  # cursor 2
    await gate.acquire_sample(3, SHORT)  # cursor -1
    with pytest.raises(DeadlineExceeded):
        await gate.acquire_sample(1, SHORT)
    assert gate.limiter.samples == 3  # the refused sample was not counted
    waiter = asyncio.create_task(gate.acquire_sample(2, 5.0))
    await asyncio.sleep(0)
    assert not waiter.done()
    await gate.acquire_insert(1, SHORT)  # cursor 0: one more sample allowed, not two
    await asyncio.sleep(0.01)
    assert not waiter.done() and gate.limiter.samples == 4  # one taken, waiting for the next
    await gate.acquire_insert(1, SHORT)
    await asyncio.wait_for(waiter, 1.0)
    assert gate.limiter.samples == 5 and gate.limiter.cursor == -1


async def test_ratio_gate_blocks_inserts_until_samples_arrive() -> None:
    gate = RateGate(ratio(min_size=1, spi=1.0, error_buffer=2.0))  # min_diff -1, max_diff 3
    await gate.acquire_insert(3, SHORT)
    with pytest.raises(DeadlineExceeded):
        await gate.acquire_insert(1, SHORT)
    waiter = asyncio.create_task(gate.acquire_insert(1, 5.0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await gate.acquire_sample(1, SHORT)
    await asyncio.wait_for(waiter, 1.0)
    assert gate.limiter.inserts == 4


async def test_sample_batch_larger_than_the_band_goes_through_item_by_item() -> None:
    gate = RateGate(ratio(min_size=1, spi=1.0, error_buffer=2.0))
    await gate.acquire_insert(3, SHORT)  # cursor 3; samples allowed down to -1: 4 of them
    batch = asyncio.create_task(gate.acquire_sample(10, 5.0))
    for _ in range(6):
        await asyncio.sleep(0)
        await gate.acquire_insert(1, 1.0)  # each insert frees one more sample
    await asyncio.wait_for(batch, 1.0)
    assert gate.limiter.samples == 10


async def test_timed_out_partial_sample_batch_is_given_back() -> None:
    gate = RateGate(queue(5))
    await gate.acquire_insert(3, SHORT)
    with pytest.raises(DeadlineExceeded, match="allowed 3 of 4 samples"):
        await gate.acquire_sample(4, SHORT)
    assert gate.limiter.samples == 0
    await gate.acquire_sample(3, SHORT)  # the three are still there for someone else


async def test_cancelled_sample_waiter_gives_back_what_it_took() -> None:
    gate = RateGate(queue(5))
    await gate.acquire_insert(2, SHORT)
    waiter = asyncio.create_task(gate.acquire_sample(4, 5.0))
    await asyncio.sleep(0.01)
    assert gate.limiter.samples == 2
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert gate.limiter.samples == 0


async def test_min_size_blocks_samples_then_serves() -> None:
    gate = RateGate(make_rate_limiter(MinSizeLimiter(type="min_size", min_size=3)))
    await gate.acquire_insert(2, SHORT)
    with pytest.raises(DeadlineExceeded):
        await gate.acquire_sample(1, SHORT)
    waiter = asyncio.create_task(gate.acquire_sample(500, 5.0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await gate.acquire_insert(1, SHORT)
    await asyncio.wait_for(waiter, 1.0)
    await gate.acquire_sample(10_000, SHORT)  # past min size, samples never wait
    for _ in range(100):
        await gate.acquire_insert(5, SHORT)  # and inserts never do


async def test_queue_alternates_inserts_and_samples() -> None:
    gate = RateGate(queue(2))
    with pytest.raises(DeadlineExceeded):
        await gate.acquire_sample(1, SHORT)  # empty
    await gate.acquire_insert(2, SHORT)
    with pytest.raises(DeadlineExceeded):
        await gate.acquire_insert(1, SHORT)  # full: 2 unsampled
    await gate.acquire_sample(1, SHORT)
    gate.on_delete(1)  # max_times_sampled 1: the sampled item leaves
    await gate.acquire_insert(1, SHORT)
    await gate.acquire_sample(2, SHORT)
    gate.on_delete(2)
    with pytest.raises(DeadlineExceeded):
        await gate.acquire_sample(1, SHORT)


async def test_queue_push_larger_than_queue_fails_at_once() -> None:
    gate = RateGate(queue(4))
    started = time.monotonic()
    with pytest.raises(ValidationFailed, match="push of 5 items can never pass"):
        await gate.acquire_insert(5, 10.0)
    assert time.monotonic() - started < 1.0
    await gate.acquire_insert(4, SHORT)


async def test_size_fn_overrides_the_counted_size() -> None:
    size = 0
    gate = RateGate(
        make_rate_limiter(MinSizeLimiter(type="min_size", min_size=2)), size_fn=lambda: size
    )
    await gate.acquire_insert(5, SHORT)  # five pushes of one key: the table still holds 0
    with pytest.raises(DeadlineExceeded):
        await gate.acquire_sample(1, SHORT)
    waiter = asyncio.create_task(gate.acquire_sample(1, 5.0))
    await asyncio.sleep(0.01)
    size = 2
    gate.notify()
    await asyncio.wait_for(waiter, 1.0)


async def test_waiter_wakes_on_change_not_on_a_timer() -> None:
    gate = RateGate(queue(1))
    waiter = asyncio.create_task(gate.acquire_sample(1, 30.0))
    await asyncio.sleep(0.02)
    started = time.monotonic()
    await gate.acquire_insert(1, SHORT)
    await asyncio.wait_for(waiter, 1.0)
    assert time.monotonic() - started < 0.01


async def test_close_fails_waiters_and_later_calls() -> None:
    gate = RateGate(queue(1))
    waiter = asyncio.create_task(gate.acquire_sample(1, 30.0))
    await asyncio.sleep(0.01)
    gate.close(TableNotFound("table 't' was dropped"))
    with pytest.raises(TableNotFound, match="dropped"):
        await waiter
    with pytest.raises(TableNotFound):
        await gate.acquire_insert(1, SHORT)


def test_limited_is_false_only_without_a_limiter() -> None:
    assert not RateGate(make_rate_limiter(None)).limited
    assert RateGate(queue(3)).limited
    assert RateGate(make_rate_limiter(MinSizeLimiter(type="min_size", min_size=1))).limited
