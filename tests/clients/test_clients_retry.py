"""Retries: only where a repeat cannot change the outcome; backoff with jitter; Retry-After."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from rlreplay.clients import Overloaded, ReplayClient, Unavailable, ValidationFailed
from rlreplay.clients.retry import RetryPolicy, parse_retry_after
from tests.clients.replay_fake import answer, error

Call = Callable[[ReplayClient], Awaitable[Any]]

CALLS: dict[str, Call] = {
    "push": lambda rb: rb.push("t", [{"key": "k", "value": 1}]),
    "get": lambda rb: rb.get("t", "k"),
    "get_many": lambda rb: rb.get_many("t", ["k"]),
    "delete": lambda rb: rb.delete("t", ["k"]),
    "update_priorities": lambda rb: rb.update_priorities("t", {"k": 1.0}),
    "describe_table": lambda rb: rb.describe_table("t"),
    "create_table": lambda rb: rb.create_table("t"),
    "sample": lambda rb: rb.sample("t", 1),
}
IDEMPOTENT = [name for name in CALLS if name != "sample"]

OK_BODY = {"accepted": 1, "items": [], "updated": 1, "missing": 0, "key": "k"}


class Flaky:
    """Fails the first ``failures`` requests with ``fail``, then answers 200."""

    def __init__(self, failures: int, fail: Callable[[httpx.Request], httpx.Response]) -> None:
        self.failures = failures
        self.fail = fail
        self.calls = 0
        self.times: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        self.times.append(time.monotonic())
        if self.calls <= self.failures:
            return self.fail(request)
        return answer(request, 200, OK_BODY)


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def dropped(request: httpx.Request) -> httpx.Response:
    raise httpx.RemoteProtocolError("server disconnected", request=request)


def overloaded(request: httpx.Request) -> httpx.Response:
    return error(request, 503, "overloaded", **{"Retry-After": "0"})


def unavailable(request: httpx.Request) -> httpx.Response:
    return error(request, 503, "unavailable")


def client_for(handler: Flaky, retries: int = 3) -> ReplayClient:
    return ReplayClient(
        "http://x",
        retries=retries,
        backoff_s=0.001,
        max_backoff_s=0.004,
        transport=httpx.MockTransport(handler),
    )


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("fail", [refused, overloaded], ids=["refused", "overloaded"])
async def test_every_call_retries_when_nothing_reached_the_server(
    name: str, fail: Callable[[httpx.Request], httpx.Response]
) -> None:
    flaky = Flaky(2, fail)
    async with client_for(flaky) as rb:
        await CALLS[name](rb)
    assert flaky.calls == 3


@pytest.mark.parametrize("name", IDEMPOTENT)
@pytest.mark.parametrize("fail", [dropped, unavailable], ids=["dropped", "unavailable"])
async def test_idempotent_calls_retry_when_the_server_may_have_acted(
    name: str, fail: Callable[[httpx.Request], httpx.Response]
) -> None:
    flaky = Flaky(2, fail)
    async with client_for(flaky) as rb:
        await CALLS[name](rb)
    assert flaky.calls == 3


@pytest.mark.parametrize(
    ("fail", "raised"), [(dropped, Unavailable), (unavailable, Unavailable)], ids=["dropped", "503"]
)
async def test_sample_is_not_retried_once_the_server_may_have_acted(
    fail: Callable[[httpx.Request], httpx.Response], raised: type[Exception]
) -> None:
    flaky = Flaky(1, fail)
    async with client_for(flaky) as rb:
        with pytest.raises(raised):
            await rb.sample("t", 1)
    assert flaky.calls == 1


async def test_retries_give_up_with_the_last_error() -> None:
    flaky = Flaky(100, overloaded)
    async with client_for(flaky, retries=2) as rb:
        with pytest.raises(Overloaded) as caught:
            await rb.push("t", [{"key": "k", "value": 1}])
    assert flaky.calls == 3 and caught.value.retry_after == 0.0


async def test_an_unreachable_server_raises_unavailable_after_the_retries() -> None:
    flaky = Flaky(100, refused)
    async with client_for(flaky, retries=2) as rb:
        with pytest.raises(Unavailable) as caught:
            await rb.get("t", "k")
    assert flaky.calls == 3
    assert isinstance(caught.value.__cause__, httpx.ConnectError)


async def test_client_errors_are_not_retried() -> None:
    flaky = Flaky(100, lambda request: error(request, 422, "validation_error"))
    async with client_for(flaky) as rb:
        with pytest.raises(ValidationFailed):
            await rb.push("t", [{"key": "k", "value": 1}])
    assert flaky.calls == 1


async def test_retry_after_is_honoured() -> None:
    def slow_down(request: httpx.Request) -> httpx.Response:
        return error(request, 503, "overloaded", **{"Retry-After": "0.2"})

    flaky = Flaky(1, slow_down)
    async with client_for(flaky) as rb:
        await rb.push("t", [{"key": "k", "value": 1}])
    assert flaky.calls == 2
    assert flaky.times[1] - flaky.times[0] >= 0.2


async def test_zero_retries_means_one_attempt() -> None:
    flaky = Flaky(1, refused)
    async with client_for(flaky, retries=0) as rb:
        with pytest.raises(Unavailable):
            await rb.get("t", "k")
    assert flaky.calls == 1


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    policy = RetryPolicy(retries=10, backoff_s=0.1, max_backoff_s=1.0)
    for attempt, ceiling in [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.0), (9, 1.0)]:
        waits = [policy.delay(attempt) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert len(set(waits)) > 1  # jittered
    assert policy.delay(0, retry_after=3.0) == 3.0  # Retry-After beats the cap


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"retries": -1}, "retries"),
        ({"backoff_s": -1.0}, "backoff_s"),
        ({"backoff_s": 2.0, "max_backoff_s": 1.0}, "max_backoff_s"),
    ],
)
def test_policy_validates_eagerly(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RetryPolicy(**kwargs)


def test_parse_retry_after() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    assert parse_retry_after(None) is None
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0.25 ") == 0.25
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after("inf") is None
    assert parse_retry_after("soon") is None
    later = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(later, now=now) == 30.0
    earlier = format_datetime(now - timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(earlier, now=now) == 0.0
