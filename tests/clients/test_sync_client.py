"""The synchronous client without a server: its calls mirror ReplayClient's, its thread is
stopped by close(), by dropping it and at exit, and a ReplayClient refuses a second event loop
before sending anything."""

from __future__ import annotations

import asyncio
import gc
import inspect
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import rlreplay
from rlreplay import (
    Client,
    ReplayClient,
    ReplayError,
    ShardedClient,
    ShardedReplayClient,
    WrongEventLoop,
)
from tests.clients.replay_fake import FakeServer

#: Calls whose answer the synchronous client turns into a blocking form.
BLOCKING_ANSWERS = {
    "writer": ("Writer", "SyncWriter"),
    "episode_writer": ("EpisodeWriter", "SyncEpisodeWriter"),
    "stream": (
        "AsyncIterator[list[Item] | ColumnBatch | WindowBatch]",
        "SyncStream[list[Item]] | SyncStream[ColumnBatch] | SyncStream[WindowBatch]",
    ),
    "claim": ("Lease", "SyncLease"),
    "sharded claim": ("ShardedLease", "SyncLease"),
    "consume": ("AsyncGenerator[LeaseBase, None]", "SyncStream[SyncLease]"),
}
ASYNC_ONLY = {"aclose"}
SYNC_ONLY = {"close", "async_client", "thread"}
PAIRS = [(ReplayClient, Client), (ShardedReplayClient, ShardedClient)]


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def same_parameters(a: Callable[..., Any], b: Callable[..., Any]) -> list[str]:
    """What differs between the parameters of ``a`` and ``b`` (names, kinds, defaults,
    annotations), as readable lines."""
    pa = list(inspect.signature(a).parameters.values())
    pb = list(inspect.signature(b).parameters.values())
    if [str(p) for p in pa] == [str(p) for p in pb]:
        return []
    return [f"{a.__qualname__}{inspect.signature(a)} != {b.__qualname__}{inspect.signature(b)}"]


@pytest.mark.parametrize(("async_cls", "sync_cls"), PAIRS)
def test_each_sync_client_has_every_call_of_its_async_one_with_the_same_parameters(
    async_cls: type, sync_cls: type
) -> None:
    sync_only = SYNC_ONLY | ({"urls"} if sync_cls is ShardedClient else set())
    assert public(sync_cls) - sync_only == public(async_cls) - ASYNC_ONLY
    problems = same_parameters(async_cls.__init__, sync_cls.__init__)
    for name in sorted(public(async_cls) - ASYNC_ONLY):
        mine, theirs = getattr(sync_cls, name), getattr(async_cls, name)
        problems += same_parameters(theirs, mine)
        async_overloads = typing.get_overloads(theirs)
        sync_overloads = typing.get_overloads(mine)
        assert len(async_overloads) == len(sync_overloads), name
        for a, s in zip(async_overloads, sync_overloads, strict=True):
            problems += same_parameters(a, s)
        returns = inspect.signature(theirs).return_annotation
        sharded = "sharded " if sync_cls is ShardedClient else ""
        expected = BLOCKING_ANSWERS.get(sharded + name, BLOCKING_ANSWERS.get(name))
        expected = expected or (returns, returns)
        assert (returns, inspect.signature(mine).return_annotation) == expected, name
        assert not inspect.iscoroutinefunction(mine), name
    assert problems == []


@pytest.fixture
def fake() -> FakeServer:
    return FakeServer()


@pytest.fixture
def client(fake: FakeServer) -> Iterator[Client]:
    with Client("http://replay.test", transport=httpx.MockTransport(fake)) as rb:
        yield rb


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_calls_block_and_answer(client: Client) -> None:
    client.create_table("t")
    assert client.push("t", [{"key": f"k{i}", "value": i} for i in range(5)]) == 5
    assert client.get("t", "k3")["value"] == 3  # type: ignore[index]
    assert client.get("t", "nope") is None
    assert [item["value"] for item in client.get_many("t", ["k1", "k2"])] == [1, 2]  # type: ignore[index]
    assert client.delete("t", ["k0"]) == 1
    assert client.describe_table("t")["stats"]["size"] == 4
    assert client.health() is True


def test_close_stops_the_thread_and_later_calls_raise(fake: FakeServer) -> None:
    rb = Client("http://replay.test", transport=httpx.MockTransport(fake))
    thread = rb.thread
    assert thread in threading.enumerate() and not thread.daemon
    rb.close()
    assert thread not in threading.enumerate()
    rb.close()  # again: nothing
    with pytest.raises(ReplayError, match="closed"):
        rb.list_tables()


def test_a_dropped_client_stops_its_thread(fake: FakeServer) -> None:
    rb = Client("http://replay.test", transport=httpx.MockTransport(fake))
    thread = rb.thread
    del rb
    gc.collect()
    wait_until(lambda: not thread.is_alive(), "the dropped client's thread still runs")


def test_an_unclosed_client_does_not_hold_up_interpreter_exit() -> None:
    script = (
        "import rlreplay\n"
        "rb = rlreplay.Client('http://127.0.0.1:9')\n"
        "rb.thread.name = 'mine'\n"
        "print('made', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "made\n", "")


def test_works_inside_a_running_event_loop(client: Client) -> None:
    async def main() -> int:
        client.create_table("t")
        pushed = client.push("t", [{"key": "k", "value": 1}])
        with client.stream("t", batch_size=2) as batches:
            assert len(next(batches)) == 2
        return pushed

    assert asyncio.run(main()) == 1


def test_stream_is_an_iterator_that_closes(client: Client) -> None:
    client.create_table("t")
    client.push("t", [{"key": "k", "value": 1}])
    batches = client.stream("t", batch_size=3, prefetch=2)
    assert [len(next(batches)) for _ in range(3)] == [3, 3, 3]
    batches.close()
    assert list(batches) == []
    batches.close()


def test_the_writer_pushes_everything_appended(client: Client, fake: FakeServer) -> None:
    client.create_table("t")
    with client.writer("t", batch_items=7) as w:
        for i in range(50):
            w.append(f"k{i}", i)
    assert w.pushed == 50
    assert client.describe_table("t")["stats"]["size"] == 50


def test_a_replay_client_refuses_a_second_event_loop_before_sending() -> None:
    fake = FakeServer()
    rb = ReplayClient("http://replay.test", transport=httpx.MockTransport(fake))
    asyncio.run(rb.create_table("t"))
    sent = len(fake.requests)
    with pytest.raises(WrongEventLoop, match=r"rlreplay\.Client") as raised:
        asyncio.run(rb.push("t", [{"key": "k", "value": 1}]))
    assert isinstance(raised.value, ReplayError)
    with pytest.raises(WrongEventLoop):
        asyncio.run(rb.health())
    assert len(fake.requests) == sent
    assert "k" not in fake.items["t"]


def test_rlreplay_exports_the_clients_and_datasets() -> None:
    names = ["Client", "ShardedClient", "RolloutBatches", "rollout_dataset", "ReplayDataset"]
    for name in [*names, "WrongEventLoop"]:
        assert name in rlreplay.__all__
        assert getattr(rlreplay, name) is not None
