"""``consume`` over scripted claims: the order leases come in, and when each is acknowledged.

The claims are a script (each answers when the test says) given to
:func:`~rlreplay.clients.rollouts.consume_leases`, the loop behind every client's
``consume``, so these tests pin down the loop's own decisions, whatever the server's timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rlreplay.clients.rollouts import LeaseBase, consume_leases


class ScriptedLease(LeaseBase):
    """A lease that records what was done with it."""

    def __init__(self, name: str) -> None:
        self.items = [{"key": name}]
        self.done = False
        self.acked = self.released = False

    async def ack(self, keys: Sequence[str] | None = None) -> int:
        self.acked = self.done = True
        return 1

    async def release(self, keys: Sequence[str] | None = None) -> int:
        self.released = self.done = True
        return 1


class ScriptedClaims:
    """Claims whose n-th answers the n-th future of ``answers``."""

    def __init__(self, answers: list[asyncio.Future[ScriptedLease]]) -> None:
        self.answers = answers
        self.claims = 0

    async def claim(self) -> LeaseBase:
        self.claims += 1
        return await self.answers[self.claims - 1]


def answered(lease: ScriptedLease | None = None) -> asyncio.Future[ScriptedLease]:
    future: asyncio.Future[ScriptedLease] = asyncio.get_running_loop().create_future()
    if lease is not None:
        future.set_result(lease)
    return future


async def test_a_prefetched_claim_answered_first_comes_first() -> None:
    """Two claims in flight: the later one holds the last ready items, the earlier one waits
    for items; the later one's lease comes at once, not after the earlier one's wait."""
    a, c = ScriptedLease("a"), ScriptedLease("c")
    waiting = answered()  # answers only when new items come: never, here
    script = ScriptedClaims([answered(a), waiting, answered(c)])
    batches = consume_leases(script.claim, prefetch=2)
    assert await anext(batches) is a
    async with asyncio.timeout(5):
        assert await anext(batches) is c
    await batches.aclose()
    assert a.acked and c.released and not c.acked
    assert waiting.cancelled()


async def test_the_lease_in_hand_is_acked_when_the_next_is_asked_for() -> None:
    """The ack does not wait for the next claim's answer (which may take longer than the
    lease lasts)."""
    a, b = ScriptedLease("a"), ScriptedLease("b")
    later = answered()
    script = ScriptedClaims([answered(a), later])
    batches = consume_leases(script.claim, prefetch=1)
    assert await anext(batches) is a
    asking = asyncio.ensure_future(anext(batches))
    for _ in range(10):  # let the loop run up to its wait for the claim
        await asyncio.sleep(0)
    assert a.acked and not asking.done()
    later.set_result(b)
    assert await asking is b
    await batches.aclose()
    assert b.released and not b.acked
