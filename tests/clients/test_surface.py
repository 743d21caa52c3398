"""One client surface: the calls every client shares have the parameters ``ReplayCalls``
declares, in all four clients, and a claim's options are one declaration.

mypy checks the async clients against the protocol (``make lint``); this test checks all four
at run time, the synchronous ones included, so that a parameter added to one client and not
to the others fails here.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from msgspec import UNSET

from rlreplay import Client, ReplayClient, ShardedClient, ShardedReplayClient
from rlreplay.clients.rollouts import claim_request
from rlreplay.clients.surface import ClaimOptions, ReplayCalls
from rlreplay.wire.schemas import ClaimRequest
from tests.clients.replay_fake import FakeServer

ASYNC = [ReplayClient, ShardedReplayClient]
BLOCKING = [Client, ShardedClient]
SHARED = sorted(
    name
    for name in vars(ReplayCalls)
    if not name.startswith("_") and callable(vars(ReplayCalls)[name])
)
#: Keyword parameters a client adds to a shared call, after the shared ones.
EXTRA = {
    ("ShardedReplayClient", "sample"): ["allow_partial"],
    ("ShardedClient", "sample"): ["allow_partial"],
}
#: What each client has beside the shared calls.
OWN = {
    ReplayClient: {"get_many_packed", "changes", "table_index", "snapshot", "snapshots"},
    ShardedReplayClient: {"owner", "snapshot", "snapshots"},  # and the attribute urls
    Client: {
        "get_many_packed",
        "changes",
        "table_index",
        "snapshot",
        "snapshots",
        "close",
        "async_client",
        "thread",
    },
    ShardedClient: {"owner", "urls", "snapshot", "snapshots", "close", "async_client", "thread"},
}


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def parameters(call: Callable[..., Any]) -> list[str]:
    """The call's parameters as written (name, kind, default, annotation), ``self`` left out."""
    return [str(p) for p in inspect.signature(call).parameters.values()][1:]


def shared_part(cls: type, name: str, call: Callable[..., Any]) -> list[str]:
    """``call``'s parameters less the keyword-only extras ``cls`` adds after the shared
    ones (before a ``**`` parameter, which stays last)."""
    extra = EXTRA.get((cls.__name__, name), [])
    params = parameters(call)
    tail = 1 if params and params[-1].startswith("**") else 0
    added = params[len(params) - len(extra) - tail : len(params) - tail]
    assert [p.split(":")[0] for p in added] == extra or not extra
    return params[: len(params) - len(extra) - tail] + params[len(params) - tail :]


def test_each_client_has_the_shared_calls_and_only_its_own_beside_them() -> None:
    assert "claim" in SHARED and "sample" in SHARED
    for cls in ASYNC + BLOCKING:
        shared = set(SHARED) - ({"aclose"} if cls in BLOCKING else set())
        assert public(cls) - shared == OWN[cls], cls.__name__
        assert shared <= public(cls), cls.__name__


@pytest.mark.parametrize("cls", ASYNC + BLOCKING, ids=lambda cls: cls.__name__)
def test_every_shared_call_has_the_declared_parameters(cls: type) -> None:
    problems = []
    for name in SHARED:
        if cls in BLOCKING and name == "aclose":
            continue
        mine, theirs = getattr(cls, name), getattr(ReplayCalls, name)
        if shared_part(cls, name, mine) != parameters(theirs):
            problems.append(f"{cls.__name__}.{name}{inspect.signature(mine)}")
        overloads = typing.get_overloads(mine)
        assert len(overloads) == len(typing.get_overloads(theirs)), (cls.__name__, name)
        for a, b in zip(overloads, typing.get_overloads(theirs), strict=True):
            if shared_part(cls, name, a) != parameters(b):
                problems.append(f"{cls.__name__}.{name} overload {inspect.signature(a)}")
        # async clients keep the protocol's async calls; blocking clients have none
        expected = inspect.iscoroutinefunction(theirs) and cls in ASYNC
        assert inspect.iscoroutinefunction(mine) == expected, (cls.__name__, name)
    assert problems == []


def test_claim_and_consume_take_one_declaration_of_options() -> None:
    for cls in ASYNC + BLOCKING:
        for name, own in (("claim", "partial"), ("consume", "prefetch")):
            params = list(inspect.signature(getattr(cls, name)).parameters.values())
            assert [p.name for p in params] == ["self", "table", own, "options"], cls
            assert "ClaimOptions" in str(params[-1].annotation)


def test_claim_options_default_to_the_wire_request() -> None:
    assert claim_request({"task": "t", "batch_size": 4}, partial=False) == ClaimRequest("t", 4)
    options: ClaimOptions = {
        "task": "t",
        "batch_size": 8,
        "fields": ("a",),
        "group_size": 4,
        "lease_s": 5.0,
        "wait_ms": 0,
        "min_version": 3,
    }
    request = claim_request(options, partial=True)
    assert request == ClaimRequest("t", 8, ["a"], 4, 5.0, 0, True, 3)
    none: ClaimOptions = {"task": "t", "batch_size": 1, "fields": None, "group_size": None}
    assert claim_request(none, partial=False).fields is UNSET


@pytest.fixture
def fake() -> FakeServer:
    return FakeServer()


async def test_a_misspelled_or_missing_claim_option_raises_before_sending(fake: FakeServer) -> None:
    async with ReplayClient("http://replay.test", transport=httpx.MockTransport(fake)) as rb:
        with pytest.raises(TypeError, match="batchsize"):
            await rb.claim("t", task="x", batchsize=4)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="task"):
            await rb.claim("t", batch_size=4)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="partial"):
            rb.consume("t", task="x", batch_size=4, partial=True)  # type: ignore[call-arg]
    assert fake.requests == []


def test_the_sharded_blocking_sample_passes_allow_partial(fake: FakeServer) -> None:
    urls = ["http://a.test", "http://b.test"]
    with ShardedClient(urls, transport=httpx.MockTransport(fake)) as rb:
        seen: list[Any] = []

        async def sample(table: str, batch_size: int, **options: Any) -> list[Any]:
            seen.append(options.get("allow_partial"))
            return []

        rb.async_client.sample = sample  # type: ignore[method-assign]
        rb.sample("t", 4, allow_partial=True)
        rb.sample("t", 4, allow_partial=True, layout="columns")
    assert seen == [True, True]


async def test_the_sharded_client_creates_rollout_tables(fake: FakeServer) -> None:
    urls = ["http://a.test", "http://b.test"]
    async with ShardedReplayClient(urls, transport=httpx.MockTransport(fake)) as rb:
        await rb.create_table("r", max_staleness=2, delete_after_ack=["trainer"])
    assert fake.tables["r"]["max_staleness"] == 2
    assert fake.tables["r"]["delete_after_ack"] == ["trainer"]
