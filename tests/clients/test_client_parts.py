"""ReplayClient is a façade over parts that take the requester in their constructors: each
forwarder spells out its part's signature (so a reader and mypy can follow a call from the
client to the part, and the two cannot drift apart), every call is some part's, and no method
is resolved through a base class. The overloads users see (``sample``, ``stream``,
``get_many``) are the client's, checked against ``ReplayCalls`` in ``test_surface.py``."""

from __future__ import annotations

import inspect
import typing

import httpx

from rlreplay.clients.blocking_writer import BlockingWriter
from rlreplay.clients.client import ReplayClient
from rlreplay.clients.episode_writer import EpisodeWriter
from rlreplay.clients.episodes import Episodes
from rlreplay.clients.in_flight import InFlight
from rlreplay.clients.items import Items
from rlreplay.clients.loop_thread import LoopThread
from rlreplay.clients.requester import Requester
from rlreplay.clients.rollouts import Rollouts
from rlreplay.clients.samples import Samples
from rlreplay.clients.sync_episode_writer import SyncEpisodeWriter
from rlreplay.clients.sync_writer import SyncWriter
from rlreplay.clients.tables import Tables
from rlreplay.clients.writer import Writer
from tests.clients.replay_fake import FakeServer

#: Each part's calls, as the client forwards them (client name -> part name).
FORWARDED: dict[type, dict[str, str]] = {
    Requester: {"aclose": "aclose", "health": "health"},
    Tables: {
        name: name
        for name in (
            "create_table",
            "list_tables",
            "describe_table",
            "drop_table",
            "snapshot",
            "snapshots",
        )
    },
    Items: {
        **{
            name: name
            for name in (
                "push",
                "push_columns",
                "writer",
                "get",
                "get_many",
                "get_many_packed",
                "update_priorities",
                "delete",
                "changes",
                "table_index",
            )
        },
        "_push_body": "push_body",
    },
    Samples: {"sample": "sample", "stream": "stream", "_sample_windows": "sample_windows"},
    Rollouts: {
        **{
            name: name
            for name in (
                "patch",
                "claim",
                "consume",
                "set_version",
                "reserve",
                "return_reservation",
                "tasks",
            )
        },
        "_claim": "claim_body",
    },
    Episodes: {
        **{
            name: name
            for name in (
                "append_steps",
                "episode_writer",
                "get_episode",
                "delete_episode",
                "update_window_priorities",
            )
        },
        "_append": "append_body",
    },
}


def test_the_client_and_its_parts_stack_no_base_classes() -> None:
    for cls in [ReplayClient, *FORWARDED]:
        assert cls.__mro__ == (cls, object), cls.__name__


def test_every_public_call_of_the_client_is_a_parts() -> None:
    public = {name for name in vars(ReplayClient) if not name.startswith("_")}
    forwarded = {name for names in FORWARDED.values() for name in names}
    assert public == {name for name in forwarded if not name.startswith("_")}


def test_each_forwarder_has_its_parts_signature() -> None:
    for part, names in FORWARDED.items():
        for mine_name, theirs_name in names.items():
            mine, theirs = getattr(ReplayClient, mine_name), getattr(part, theirs_name)
            assert inspect.signature(mine) == inspect.signature(theirs), (part, mine_name)
            assert inspect.iscoroutinefunction(mine) == inspect.iscoroutinefunction(theirs)
            # the users' overloads are the client's (and ReplayCalls'), the part has none
            assert typing.get_overloads(theirs) == [], (part, theirs_name)


async def test_the_parts_share_the_clients_one_requester() -> None:
    fake = FakeServer()
    async with ReplayClient("http://replay.test", transport=httpx.MockTransport(fake)) as rb:
        requester = rb._requester
        for part in (rb._tables, rb._items, rb._samples, rb._rollouts, rb._episodes):
            assert part._requester is requester
        await rb.create_table("t")
        assert await rb.push("t", [{"key": "k", "value": 1}]) == 1
        assert [item["key"] for item in await rb.sample("t", 1)] == ["k"]
        assert await rb.health()
    assert [request.url.path for request in fake.requests][-2:] == [
        "/v1/tables/t/sample",
        "/healthz",
    ]


async def nothing_sent(*args: object) -> int:
    raise AssertionError("nothing is sent")


def test_both_writers_hold_the_in_flight_part_and_the_sync_ones_a_blocking_writer() -> None:
    writer, episode_writer = Writer(nothing_sent), EpisodeWriter(nothing_sent)
    for each in (writer, episode_writer):
        assert type(each).__mro__ == (type(each), object)
        assert [type(v) for v in vars(each).values()].count(InFlight) == 1
    loop = LoopThread("test-writers")
    try:
        for sync in (SyncWriter(loop, writer), SyncEpisodeWriter(loop, episode_writer)):
            assert type(sync).__mro__ == (type(sync), object)
            assert [type(v) for v in vars(sync).values()] == [BlockingWriter]
    finally:
        loop.close()
