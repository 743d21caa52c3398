"""The pipelined writer: batches in append order, at most ``max_in_flight`` in flight, a key
never overtaken, errors surfaced once, a flush on exit."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from rlreplay.clients import ReplayClient, ValidationFailed, Writer
from rlreplay.wire.codec import unpackb
from rlreplay.wire.schemas import ItemIn
from tests.clients.replay_fake import FakeServer


class Sends:
    """A fake push: records each batch; with ``hold``, each waits until released."""

    def __init__(self, *, hold: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.stored: dict[str, Any] = {}  # each value as a server applies pushes on arrival
        self.in_flight = 0
        self.most_in_flight = 0
        self.hold = hold
        self.gates: list[asyncio.Event] = []
        self.fail: set[int] = set()  # batch numbers that fail

    async def __call__(self, items: list[ItemIn]) -> int:
        number = len(self.batches)
        self.batches.append([item.key for item in items])
        self.stored.update((item.key, unpackb(bytes(item.value))) for item in items)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.hold:
                gate = asyncio.Event()
                self.gates.append(gate)
                await gate.wait()
            if number in self.fail:
                raise ValidationFailed(f"batch {number} refused")
            return len(items)
        finally:
            self.in_flight -= 1

    def release(self, i: int) -> None:
        self.gates[i].set()


async def settle() -> None:
    """Let every runnable task run until each waits on something."""
    for _ in range(20):
        await asyncio.sleep(0)


async def wait_for(condition: Callable[[], bool]) -> None:
    """Let the loop run until ``condition`` holds (a generous number of turns, against hangs)."""
    for _ in range(100_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_batches_go_in_append_order_and_flush_sends_the_rest() -> None:
    sends = Sends()
    async with Writer(sends, max_in_flight=2, batch_items=3) as w:
        for i in range(10):
            await w.append(f"k{i}", i)
        await w.flush()
        assert sends.batches == [["k0", "k1", "k2"], ["k3", "k4", "k5"], ["k6", "k7", "k8"], ["k9"]]
        assert w.pushed == 10 and w.in_flight == 0


async def test_no_more_than_max_in_flight_pushes_and_append_waits_for_a_slot() -> None:
    sends = Sends(hold=True)
    w = Writer(sends, max_in_flight=2, batch_items=1)
    await w.append("a", 1)
    await w.append("b", 2)
    await settle()
    assert sends.in_flight == 2
    third = asyncio.create_task(w.append("c", 3))
    await settle()
    assert not third.done() and len(sends.batches) == 2  # waits for a free slot
    sends.release(0)
    await third
    await settle()
    assert sends.batches == [["a"], ["b"], ["c"]] and sends.most_in_flight == 2
    sends.release(1)
    sends.release(2)
    await w.flush()
    assert w.pushed == 3


async def test_a_key_in_flight_is_not_overtaken_by_a_later_value() -> None:
    sends = Sends(hold=True)
    w = Writer(sends, max_in_flight=4, batch_items=1)
    await w.append("a", 1)
    await w.append("b", 1)
    again = asyncio.create_task(w.append("a", 2))
    await settle()
    assert not again.done() and sends.batches == [["a"], ["b"]]
    sends.release(1)  # b answered: a's slot is still taken by the first a
    await settle()
    assert not again.done()
    sends.release(0)
    await again
    await settle()
    assert sends.batches == [["a"], ["b"], ["a"]]
    sends.release(2)
    await w.flush()


async def test_a_failed_push_surfaces_once_at_the_next_append() -> None:
    sends = Sends()
    sends.fail = {0}
    w = Writer(sends, max_in_flight=2, batch_items=2)
    await w.append("a", 1)
    await w.append("b", 1)  # sends batch 0
    await settle()
    with pytest.raises(ValidationFailed, match="batch 0 refused") as caught:
        await w.append("c", 1)
    assert any("'a' to 'b' was not pushed" in note for note in caught.value.__notes__)
    await w.append("c", 1)  # raised once: the writer goes on
    await w.append("d", 1)
    await w.flush()
    assert w.pushed == 2 and sends.batches[1:] == [["c", "d"]]


async def test_a_failed_push_surfaces_at_flush() -> None:
    sends = Sends()
    sends.fail = {1}
    w = Writer(sends, max_in_flight=4, batch_items=1)
    await w.append("a", 1)
    await w.append("b", 1)
    with pytest.raises(ValidationFailed, match="batch 1 refused"):
        await w.flush()
    await w.flush()  # nothing more to say
    assert w.pushed == 1


async def test_exiting_the_block_flushes_and_surfaces_errors() -> None:
    sends = Sends()
    async with Writer(sends, max_in_flight=1, batch_items=4) as w:
        await w.append("a", 1)
    assert sends.batches == [["a"]] and w.pushed == 1
    with pytest.raises(RuntimeError):
        await w.append("b", 1)
    failing = Sends()
    failing.fail = {0}
    with pytest.raises(ValidationFailed):
        async with Writer(failing, batch_items=8) as w:
            await w.append("a", 1)


async def test_a_block_that_raises_waits_for_the_pushes_in_flight_and_sends_no_more() -> None:
    sends = Sends()
    with pytest.raises(KeyError):
        async with Writer(sends, max_in_flight=2, batch_items=2) as w:
            for key in "abc":
                await w.append(key, 1)
            raise KeyError("boom")
    assert sends.batches == [["a", "b"]] and w.in_flight == 0


async def test_batches_from_several_tasks_holding_a_key_are_sent_in_append_order() -> None:
    sends = Sends(hold=True)
    w = Writer(sends, max_in_flight=4, batch_items=2)
    await w.append("m", 1)
    await w.append("x", 1)  # push 0 holds "m" until released

    async def first() -> None:
        await w.append("k", "old")
        await w.append("m", 2)  # this batch waits for push 0, which holds "m"

    async def second() -> None:
        await w.append("k", "new")
        await w.append("n", 1)

    tasks = [asyncio.create_task(first()), asyncio.create_task(second())]
    await settle()
    assert sends.batches == [["m", "x"]]  # "k" from the second task does not overtake
    for i in range(3):  # each batch holds a key of the one before: one at a time
        await wait_for(lambda n=i + 1: len(sends.gates) == n)
        assert sends.in_flight == 1
        sends.release(i)
    await asyncio.gather(*tasks)
    await w.flush()
    assert sends.batches == [["m", "x"], ["k", "m"], ["k", "n"]]
    assert sends.stored == {"m": 2, "x": 1, "k": "new", "n": 1}


@pytest.mark.parametrize("seed", range(20))
async def test_with_several_producers_the_last_value_appended_is_stored(seed: int) -> None:
    rng = random.Random(seed)
    expected: dict[str, int] = {}

    async def send(items: list[ItemIn]) -> int:
        await sends(items)
        for _ in range(rng.randrange(12)):  # answers come back in a shuffled order
            await asyncio.sleep(0)
        return len(items)

    async def produce(w: Writer) -> None:
        for _ in range(40):
            key, value = f"k{rng.randrange(6)}", rng.randrange(10**6)
            expected[key] = value  # append takes the item before it can wait
            await w.append(key, value)
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)

    sends = Sends()
    async with Writer(send, max_in_flight=3, batch_items=rng.randrange(1, 4)) as w:
        await asyncio.gather(*(produce(w) for _ in range(4)))
    assert sends.stored == expected and sends.most_in_flight <= 3


async def test_an_append_cancelled_while_its_batch_waits_still_sends_the_batch() -> None:
    sends = Sends(hold=True)
    w = Writer(sends, max_in_flight=1, batch_items=2)
    await w.append("a", 1)
    await w.append("b", 1)
    await w.append("c", 1)
    waiting = asyncio.create_task(w.append("d", 1))  # its batch waits for the one slot
    await settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    sends.release(0)
    await wait_for(lambda: len(sends.gates) == 2)
    sends.release(1)
    await w.flush()
    assert sends.batches == [["a", "b"], ["c", "d"]] and w.pushed == 4


async def test_an_append_that_raises_an_earlier_error_does_not_take_its_item() -> None:
    sends = Sends()
    sends.fail = {0}
    w = Writer(sends, max_in_flight=2, batch_items=2)
    await w.append("a", 1)
    await w.append("b", 1)
    await settle()
    with pytest.raises(ValidationFailed):
        await w.append("c", 1)
    await w.flush()
    assert sends.batches == [["a", "b"]]  # "c" was not taken
    await w.append("c", 1)
    await w.flush()
    assert sends.batches[1:] == [["c"]] and w.pushed == 1


async def test_the_writer_is_closed_even_when_its_exit_flush_fails() -> None:
    sends = Sends()
    sends.fail = {0}
    with pytest.raises(ValidationFailed):
        async with Writer(sends, batch_items=8) as w:
            await w.append("a", 1)
    with pytest.raises(RuntimeError, match="exited"):
        await w.append("b", 1)
    await w.flush()
    assert sends.batches == [["a"]]


async def test_cancelling_the_block_cancels_the_pushes_in_flight() -> None:
    sends = Sends(hold=True)  # never answered: the exit must not wait for them
    w = Writer(sends, max_in_flight=2, batch_items=1)

    async def block() -> None:
        async with w:
            for key in "abc":
                await w.append(key, 1)  # "c" waits for a slot

    task = asyncio.create_task(block())
    await wait_for(lambda: sends.in_flight == 2)
    other = asyncio.create_task(w.append("d", 1))  # another task's batch, queued behind "c"
    await settle()
    task.cancel()
    await wait_for(task.done)
    assert task.cancelled() and sends.in_flight == 0 and w.in_flight == 0
    with pytest.raises(RuntimeError, match="exited"):
        await other  # its item was dropped with the block's: it is told so
    assert sends.batches == [["a"], ["b"]]


async def test_cancelling_the_exit_flush_cancels_the_pushes_in_flight() -> None:
    sends = Sends(hold=True)

    async def block() -> None:
        async with Writer(sends, max_in_flight=2, batch_items=4) as w:
            await w.append("a", 1)

    task = asyncio.create_task(block())
    await wait_for(lambda: sends.in_flight == 1)
    task.cancel()
    await wait_for(task.done)
    assert task.cancelled() and sends.in_flight == 0


async def test_values_are_packed_when_appended() -> None:
    sends: list[list[ItemIn]] = []

    async def send(items: list[ItemIn]) -> int:
        sends.append(items)
        return len(items)

    obs = np.zeros(3, dtype="<f4")
    async with Writer(send, batch_items=8) as w:
        await w.append("a", {"obs": obs}, priority=2.0)
        obs[:] = 7
    (item,) = sends[0]
    assert unpackb(bytes(item.value))["obs"].tolist() == [0, 0, 0] and item.priority == 2.0


def test_the_writer_validates_eagerly() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        Writer(Sends(), max_in_flight=0)
    with pytest.raises(ValueError, match="batch_items"):
        Writer(Sends(), batch_items=0)
    for bad in (2.5, True, "2"):
        with pytest.raises(TypeError, match=r"max_in_flight \(.*\) must be an int"):
            Writer(Sends(), max_in_flight=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"batch_items \(.*\) must be an int"):
            Writer(Sends(), batch_items=bad)  # type: ignore[arg-type]


async def test_the_clients_writer_pushes_through_the_server() -> None:
    fake = FakeServer()
    async with ReplayClient("http://replay.test", transport=httpx.MockTransport(fake)) as rb:
        await rb.create_table("t")
        async with rb.writer("t", max_in_flight=3, batch_items=2) as w:
            for i in range(5):
                await w.append(f"k{i}", {"i": i}, priority=float(i))
        got = await rb.get_many("t", [f"k{i}" for i in range(5)])
    assert [item["value"]["i"] for item in got if item] == [0, 1, 2, 3, 4]
    assert [item["priority"] for item in got if item] == [0.0, 1.0, 2.0, 3.0, 4.0]
    pushes = [r for r in fake.requests if r.url.path.endswith("/items")]
    assert len(pushes) == 3
