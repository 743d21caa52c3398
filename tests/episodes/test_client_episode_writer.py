"""The episode writer without a server: steps numbered per episode, one append in flight per
episode and at most ``max_in_flight`` in all, order kept within an episode, ``end`` folded
into the append waiting before it, errors raised once and a failed episode closed."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from rlreplay.clients.episode_writer import EpisodeWriter
from rlreplay.wire.codec import unpackb
from rlreplay.wire.episode_schemas import EpisodeStepsRequest
from rlreplay.wire.errors import StepConflict, ValidationFailed


class FakeSender:
    """Records every append and answers each once the test lets it (or at once)."""

    def __init__(self, *, hold: bool = False) -> None:
        self.sent: list[tuple[str, int, int, Any]] = []  # episode, start, count, end
        self.in_flight: dict[str, int] = {}
        self.most_in_flight = 0
        self.most_per_episode = 0
        self.hold = hold
        self.release = asyncio.Event()
        self.fail: set[tuple[str, int]] = set()

    async def __call__(self, episode: str, body: EpisodeStepsRequest) -> int:
        steps = unpackb(body.steps)
        count = len(next(iter(steps.values()))) if steps else 0
        end = None if not body.end else body.end.reason
        self.sent.append((episode, body.start, count, end))
        self.in_flight[episode] = self.in_flight.get(episode, 0) + 1
        self.most_per_episode = max(self.most_per_episode, self.in_flight[episode])
        self.most_in_flight = max(self.most_in_flight, sum(self.in_flight.values()))
        try:
            await asyncio.sleep(0)
            if self.hold:
                await self.release.wait()
            if (episode, body.start) in self.fail:
                raise StepConflict(f"episode {episode!r} holds other steps")
            return count
        finally:
            self.in_flight[episode] -= 1


def steps(k: int, offset: int = 0) -> dict[str, np.ndarray]:
    return {"obs": np.arange(offset, offset + k, dtype=np.float32).reshape(k, 1)}


async def test_steps_are_numbered_per_episode_and_kept_in_order() -> None:
    send = FakeSender()
    async with EpisodeWriter(send, max_in_flight=3) as w:

        async def actor(name: str, chunks: list[int]) -> None:
            for k in chunks:
                await w.append(name, steps(k))

        await asyncio.gather(*(actor(f"ep-{i}", [1, 2, 3, 1]) for i in range(6)))
        assert w.next_start("ep-0") == 7
        await w.end("ep-0", "terminated")
        assert w.next_start("ep-0") == 0
    assert send.most_per_episode == 1
    assert send.most_in_flight <= 3
    for i in range(6):
        mine = [(start, count) for ep, start, count, _ in send.sent if ep == f"ep-{i}"]
        assert [start for start, _ in mine[:4]] == [0, 1, 3, 6]
    assert w.appended == 6 * 7


async def test_one_append_in_flight_per_episode_others_go_meanwhile() -> None:
    send = FakeSender(hold=True)
    w = EpisodeWriter(send, max_in_flight=4)
    await w.append("a", steps(1))
    second = asyncio.create_task(w.append("a", steps(1)))  # waits for the first's answer
    await w.append("b", steps(2))
    await asyncio.sleep(0.01)
    assert [(ep, start) for ep, start, _, _ in send.sent] == [("a", 0), ("b", 0)]
    assert not second.done()
    send.release.set()
    await second
    await w.flush()
    assert [(ep, start) for ep, start, _, _ in send.sent] == [("a", 0), ("b", 0), ("a", 1)]


async def test_end_folds_into_the_append_waiting_before_it() -> None:
    send = FakeSender(hold=True)
    w = EpisodeWriter(send, max_in_flight=2)
    await w.append("a", steps(2))
    waiting = asyncio.create_task(w.append("a", steps(3)))
    await asyncio.sleep(0.01)
    await w.end("a", "truncated", final={"obs": np.zeros(1, np.float32)})
    await w.end("b", "terminated")  # nothing waiting: an append of no steps
    send.release.set()
    await waiting
    await w.flush()
    assert sorted(send.sent) == [
        ("a", 0, 2, None),
        ("a", 2, 3, "truncated"),
        ("b", 0, 0, "terminated"),
    ]


async def test_a_failed_append_is_raised_once_and_closes_its_episode() -> None:
    send = FakeSender()
    send.fail.add(("a", 1))
    w = EpisodeWriter(send, max_in_flight=2)
    await w.append("a", steps(1))
    await w.append("a", steps(1))
    await w.append("b", steps(1))
    await asyncio.sleep(0.01)
    with pytest.raises(StepConflict) as raised:
        await w.append("b", steps(1))
    assert "steps 1 to 1 of episode 'a'" in "".join(raised.value.__notes__)
    await w.append("b", steps(1))  # raised once; other episodes go on
    with pytest.raises(RuntimeError, match="gap"):
        await w.append("a", steps(1))
    await w.flush()
    assert [start for ep, start, _, _ in send.sent if ep == "b"] == [0, 1]


async def test_a_bad_append_is_refused_before_anything_is_queued() -> None:
    send = FakeSender()
    async with EpisodeWriter(send) as w:
        with pytest.raises(ValidationFailed, match="first axes"):
            await w.append("a", {"obs": np.zeros((2, 1)), "reward": np.zeros(3)})
        with pytest.raises(ValidationFailed, match="first axis"):
            await w.append("a", {"obs": np.float32(1.0)})
        with pytest.raises(ValidationFailed, match="priorities"):
            await w.append("a", steps(2), priorities=[1.0])
        with pytest.raises(ValidationFailed, match="end"):
            await w.end("a", "done")  # type: ignore[arg-type]
        assert w.next_start("a") == 0
    assert send.sent == []
    with pytest.raises(RuntimeError, match="exited"):
        await w.append("a", steps(1))


async def test_arrays_changed_after_append_send_what_was_appended() -> None:
    send = FakeSender(hold=True)
    seen: list[np.ndarray] = []

    async def keep(episode: str, body: EpisodeStepsRequest) -> int:
        seen.append(unpackb(body.steps)["obs"])
        return await send(episode, body)

    w = EpisodeWriter(keep)
    obs = np.zeros((1, 1), np.float32)
    await w.append("a", {"obs": obs})
    waiting = asyncio.create_task(w.append("a", {"obs": obs}))
    await asyncio.sleep(0.01)
    obs[:] = 7
    send.release.set()
    await waiting
    await w.flush()
    assert [float(a[0, 0]) for a in seen] == [0.0, 0.0]


async def test_resuming_an_episode_numbers_on_from_start() -> None:
    send = FakeSender()
    async with EpisodeWriter(send) as w:
        await w.append("a", steps(2), start=10)
        await w.append("a", steps(1))
    assert [(start, count) for _, start, count, _ in send.sent] == [(10, 2), (12, 1)]


def test_max_in_flight_is_checked() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        EpisodeWriter(FakeSender(), max_in_flight=0)
