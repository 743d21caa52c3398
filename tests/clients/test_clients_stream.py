"""stream() keeps exactly ``prefetch`` sample requests in flight and cleans up on exit."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import httpx
import pytest

from rlreplay.clients import DeadlineExceeded, ReplayClient
from tests.clients.replay_fake import answer, error


class Recorder:
    """A sample endpoint that records how many requests are in flight at once."""

    def __init__(
        self, delay_s: float = 0.01, *, fail_after: int | None = None, hang_after: int | None = None
    ) -> None:
        self.delay_s = delay_s
        self.fail_after = fail_after
        self.hang_after = hang_after
        self.in_flight = 0
        self.most = 0
        self.started = 0
        self.cancelled = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/tables/t/sample"
        self.started += 1
        number = self.started
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            hang = self.hang_after is not None and number > self.hang_after
            await asyncio.sleep(3600 if hang else self.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
        if self.fail_after is not None and number > self.fail_after:
            return error(request, 504, "deadline_exceeded")
        return answer(request, 200, {"items": [{"key": f"k{number}"}]})


async def settle(recorder: Recorder, started: int) -> None:
    """Wait (at most 2 s) until ``started`` requests have started and all have finished."""
    for _ in range(200):
        await asyncio.sleep(0.01)
        if recorder.in_flight == 0 and recorder.started >= started:
            await asyncio.sleep(0.02)  # room for any request beyond those to start
            return
    raise AssertionError(f"{recorder.started} started, {recorder.in_flight} in flight")


def client_for(recorder: Recorder) -> ReplayClient:
    return ReplayClient("http://x", transport=httpx.MockTransport(recorder))


@pytest.mark.parametrize("prefetch", [1, 3, 8])
async def test_prefetch_requests_are_in_flight_while_the_consumer_works(prefetch: int) -> None:
    recorder = Recorder(delay_s=0.005)
    seen: list[str] = []
    async with client_for(recorder) as rb:
        async with aclosing(rb.stream("t", batch_size=1, prefetch=prefetch)) as batches:
            async for batch in batches:
                seen.append(batch[0]["key"])
                await settle(recorder, len(seen) + prefetch)  # a slow trainer step
                assert recorder.started == len(seen) + prefetch
                if len(seen) == 10:
                    break
    assert recorder.most == prefetch
    assert len(set(seen)) == 10


async def test_a_fast_consumer_is_fed_by_prefetch_concurrent_requests() -> None:
    recorder = Recorder(delay_s=0.02)
    async with client_for(recorder) as rb:
        async with aclosing(rb.stream("t", batch_size=1, prefetch=4)) as batches:
            count = 0
            async for _ in batches:
                count += 1
                assert recorder.started - count <= 4  # never more than prefetch outstanding
                if count == 12:
                    break
    assert recorder.most == 4


async def test_leaving_the_stream_cancels_requests_in_flight() -> None:
    recorder = Recorder(delay_s=0.0, hang_after=1)  # one batch arrives, the rest hang
    async with client_for(recorder) as rb:
        stream = rb.stream("t", batch_size=1, prefetch=3)
        first = await anext(stream)
        assert first[0]["key"] == "k1"
        await asyncio.sleep(0.01)
        assert recorder.in_flight == 3
        await stream.aclose()
        assert recorder.in_flight == 0
        assert recorder.cancelled == 3


async def test_break_without_aclosing_still_cancels_soon() -> None:
    recorder = Recorder(delay_s=0.0, hang_after=1)
    async with client_for(recorder) as rb:
        async for _ in rb.stream("t", batch_size=1, prefetch=2):
            await asyncio.sleep(0.01)
            assert recorder.in_flight == 2
            break
        for _ in range(100):  # the event loop's async-generator finaliser runs aclose()
            if recorder.in_flight == 0:
                break
            await asyncio.sleep(0.01)
        assert recorder.in_flight == 0


async def test_an_error_ends_the_stream_and_cancels_the_rest() -> None:
    recorder = Recorder(delay_s=0.005, fail_after=3)
    seen = 0
    async with client_for(recorder) as rb:
        with pytest.raises(DeadlineExceeded):
            async with aclosing(rb.stream("t", batch_size=1, prefetch=2)) as batches:
                async for _ in batches:
                    seen += 1
        await asyncio.sleep(0.01)
        assert recorder.in_flight == 0
    assert seen == 3


async def test_prefetch_must_be_positive() -> None:
    async with client_for(Recorder()) as rb:
        with pytest.raises(ValueError, match="prefetch"):
            await anext(rb.stream("t", prefetch=0))
