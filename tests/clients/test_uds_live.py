"""The async clients over a real ``rlreplay serve --uds``: ``ReplayClient("unix:///...")`` on
its lean transport and on httpx's, and a ``ShardedReplayClient`` whose shards mix TCP and the
Unix socket. The async client's live tests run again here with the socket's URL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path

import numpy as np
import pytest

from rlreplay import ReplayClient, ShardedReplayClient
from rlreplay.clients.server_url import server_address
from tests.clients.test_client_live import (  # noqa: F401  (run again over the socket)
    test_numpy_arrays_round_trip_bit_exactly,
    test_stream_yields_batches,
    test_the_item_api,
    test_torch_tensors_round_trip_bit_exactly,
)
from tests.clients.uds_server import live_uds  # noqa: F401  (a fixture)
from tests.live import LiveServer, running_server

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def server_url(live_uds: tuple[LiveServer, str]) -> str:  # noqa: F811
    """The socket's URL, for the tests imported from the TCP suites."""
    return live_uds[1]


@pytest.fixture(params=["lean", "httpx"])
async def rb(request: pytest.FixtureRequest, server_url: str) -> AsyncIterator[ReplayClient]:
    lean = request.param == "lean"
    async with ReplayClient(
        server_url, backoff_s=0.01, max_backoff_s=0.05, lean_transport=lean
    ) as client:
        yield client


def test_unix_urls_name_the_socket_and_keep_paths_local() -> None:
    assert server_address("unix:///run/r/replay.sock") == ("http://localhost", "/run/r/replay.sock")
    assert server_address("http://h:1") == ("http://h:1", None)
    with pytest.raises(ValueError, match="socket path"):
        server_address("unix://")


async def test_columns_round_trip_bit_exactly_over_the_socket(
    rb: ReplayClient, request: pytest.FixtureRequest
) -> None:
    table = "cols_" + request.node.callspec.id
    await rb.create_table(table)
    rng = np.random.default_rng(0)
    n = 16
    columns = {
        "obs": rng.integers(0, 256, (n, 64, 65), dtype=np.uint8),  # past one socket read
        "tokens": rng.integers(-(2**31), 2**31, (n, 1000), dtype=np.int32),
        "logp": rng.standard_normal((n, 7)).astype(">f8"),
    }
    keys = [f"k{i}" for i in range(n)]
    assert await rb.push_columns(table, keys, columns, wait=True) == n
    got = await rb.get_many(table, keys[::-1], layout="columns")
    assert got.keys == keys[::-1]
    for name, column in columns.items():
        want = column[::-1]
        assert got[name].dtype == want.dtype
        assert got[name].tobytes() == want.tobytes()
    sample = await rb.sample(table, 64, layout="columns")
    picked = [keys.index(key) for key in sample.keys]
    for name, column in columns.items():
        assert sample[name].tobytes() == column[picked].tobytes()
    async with aclosing(rb.stream(table, batch_size=8, prefetch=2, layout="columns")) as batches:
        seen = 0
        async for batch in batches:
            picked = [keys.index(key) for key in batch.keys]
            assert batch["tokens"].tobytes() == columns["tokens"][picked].tobytes()
            seen += 1
            if seen == 3:
                break


async def test_a_sharded_client_mixes_tcp_and_the_socket(server_url: str, tmp_path: Path) -> None:
    unix_url = server_url
    with running_server(tmp_path / "other") as other:
        async with ShardedReplayClient([unix_url, other.url], backoff_s=0.01) as rb:
            await rb.create_table("mixed")
            keys = [f"k{i}" for i in range(64)]
            tokens = np.arange(64 * 100, dtype=np.int32).reshape(64, 100)
            await rb.push_columns("mixed", keys, {"tokens": tokens}, wait=True)
            owners = {rb.owner(key) for key in keys}
            assert owners == {unix_url, other.url}  # both shards hold some
            got = await rb.get_many("mixed", keys, layout="columns")
            order = [keys.index(key) for key in got.keys]
            assert got["tokens"].tobytes() == tokens[order].tobytes()
            sampled = await rb.sample("mixed", 32)
            assert len(sampled) == 32
