"""Episode tables through the synchronous client and the sharded clients, on two real
servers on 127.0.0.1: each episode lives on the server its name hashes to, reads and
priorities find it there, and a window sample over both servers reports the probabilities
one server holding every episode would (uniform), with prioritized weights recomputed over
the merged batch."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from rlreplay import (
    Client,
    ReplayClient,
    ShardedClient,
    ShardedReplayClient,
    SyncEpisodeWriter,
    WindowBatch,
)
from tests.live import LiveServer, start_server, stop_server

MEMORY = ("--storage-mode", "memory", "--durability", "none")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LiveServer]]:
    root = tmp_path_factory.mktemp("episode-shards")
    started: list[LiveServer] = []
    try:
        for i in range(2):
            started.append(start_server(root / f"s{i}", *MEMORY, "--seed", str(7 + i)))
        yield started
    finally:
        for server in started:
            stop_server(server)


def steps(k: int, offset: int = 0) -> dict[str, np.ndarray]:
    return {
        "obs": np.arange(offset, offset + k, dtype=np.float32).reshape(k, 1) * [1.0, -1.0],
        "step": np.arange(offset, offset + k, dtype=np.int64),
        "reward": np.ones(k, dtype=np.float32),
    }


def test_the_sync_client_appends_reads_and_samples_windows(servers: list[LiveServer]) -> None:
    with Client(servers[0].url) as rb:
        rb.create_table("sync", episodes={"compression": "zstd"})
        assert rb.append_steps("sync", "ep-0", steps(3), start=0) == 3
        with rb.episode_writer("sync", max_in_flight=4) as w:
            assert isinstance(w, SyncEpisodeWriter)
            for t in range(5):
                w.append("ep-1", steps(1, t))
                w.append("ep-2", steps(2, 2 * t))
            assert w.next_start("ep-1") == 5
            w.end("ep-1", "terminated")
        assert w.appended == 15
        episode = rb.get_episode("sync", "ep-2")
        assert episode is not None and episode.length == 10 and episode.end is None
        np.testing.assert_array_equal(episode.steps["step"], np.arange(10))
        batch = rb.sample("sync", 8, length=3, n_step=2, gamma=0.5)
        assert isinstance(batch, WindowBatch) and batch["obs"].shape == (8, 3, 2)
        assert batch.returns is not None
        for b, start in enumerate(batch.starts.tolist()):
            np.testing.assert_array_equal(batch["step"][b], np.arange(start, start + 3))
        with rb.stream("sync", batch_size=4, prefetch=2, length=2) as windows:
            for i, window in enumerate(windows):
                assert window["step"].shape == (4, 2)
                if i == 2:
                    break
        assert rb.update_window_priorities("sync", [("ep-2", 0, 3.0)])["updated"] == 1
        rb.delete_episode("sync", "ep-0")
        assert rb.get_episode("sync", "ep-0") is None
        rb.drop_table("sync")


async def test_episodes_live_on_the_server_their_name_hashes_to(
    servers: list[LiveServer],
) -> None:
    urls = [s.url for s in servers]
    names = [f"actor-{i}" for i in range(16)]
    async with ShardedReplayClient(urls) as rb:
        await rb.create_table("owned", episodes={})
        async with rb.episode_writer("owned", max_in_flight=6) as w:
            for t in range(3):
                for name in names:
                    await w.append(name, steps(2, 2 * t))
            await w.end(names[0], "truncated", final={"obs": np.zeros(2), "step": 6, "reward": 0})
        assert await rb.append_steps("owned", names[1], steps(1, 6), start=6) == 1
        held: list[set[str]] = []
        for url in urls:
            async with ReplayClient(url) as one:
                held.append({n for n in names if await one.get_episode("owned", n) is not None})
        assert held[0] | held[1] == set(names) and not held[0] & held[1]
        assert held[0] and held[1]  # 16 names: both servers hold some
        for name in names:
            assert (name in held[1]) == (rb.owner(name) == urls[1])
        episode = await rb.get_episode("owned", names[0], start=1)
        assert episode is not None and episode.end == "truncated"
        np.testing.assert_array_equal(episode.steps["step"], np.arange(1, 6))
        answer = await rb.update_window_priorities("owned", [(n, 0, 2.0) for n in names])
        assert answer == {"updated": 16, "missing": 0}
        await rb.delete_episode("owned", names[2])
        assert await rb.get_episode("owned", names[2]) is None
        await rb.drop_table("owned")


async def test_a_sharded_window_sample_is_one_servers(servers: list[LiveServer]) -> None:
    urls = [s.url for s in servers]
    async with ShardedReplayClient(urls, seed=3) as rb:
        await rb.create_table("spread", episodes={})
        lengths = {f"ep-{i}": 3 + i for i in range(8)}
        for name, length in lengths.items():
            await rb.append_steps("spread", name, steps(length), start=0, wait=True)
        total = sum(lengths.values())
        seen: set[str] = set()
        for _ in range(5):
            batch = await rb.sample("spread", 32, length=1)
            np.testing.assert_allclose(batch.probabilities, 1 / total)
            np.testing.assert_array_equal(batch.weights, 1.0)
            starts = batch.starts.tolist()
            for b, (name, start) in enumerate(zip(batch.episodes, starts, strict=True)):
                assert batch["step"][b, 0] == start < lengths[name]
            seen |= set(batch.episodes)
        assert {rb.owner(name) for name in seen} == set(urls)
        await rb.drop_table("spread")


async def test_sharded_prioritized_weights_are_recomputed_over_the_batch(
    servers: list[LiveServer],
) -> None:
    urls = [s.url for s in servers]
    sampler = {"type": "prioritized", "exponent": 1.0, "is_exponent": 0.5}
    async with ShardedReplayClient(urls, seed=5) as rb:
        await rb.create_table("prio", episodes={}, sampler=sampler)
        for i in range(6):
            prios = np.arange(1, 5, dtype=np.float64) * (i + 1)
            await rb.append_steps("prio", f"ep-{i}", steps(4), start=0, priorities=prios)
        batch = await rb.sample("prio", 64, length=1)
        expected = (batch.probabilities.min() / batch.probabilities) ** 0.5
        np.testing.assert_allclose(batch.weights, expected)
        assert set(batch.episodes) <= {f"ep-{i}" for i in range(6)}
        await rb.drop_table("prio")


async def test_sharded_windows_split_by_each_servers_eligible_starts(
    servers: list[LiveServer],
) -> None:
    urls = [s.url for s in servers]
    sampler = {"type": "prioritized", "exponent": 1.0}
    async with ShardedReplayClient(urls, seed=11) as rb:
        await rb.create_table("fit", episodes={}, sampler=sampler)
        names = [f"ep-{i}" for i in range(40)]
        long = [n for n in names if rb.owner(n) == urls[0]][:2]
        short = [n for n in names if rb.owner(n) == urls[1]][:6]
        for i, name in enumerate(long):  # 8 steps: windows of 6 start at 0, 1, 2
            prios = np.arange(1, 9, dtype=np.float64) * (i + 1)
            await rb.append_steps("fit", name, steps(8), start=0, priorities=prios, wait=True)
        for name in short:  # many steps, none of them holding a window of 6
            await rb.append_steps("fit", name, steps(5), start=0, wait=True)
        # the second server holds most steps but no window: it gets no pick, and the
        # sample does not wait for it
        batch = await rb.sample("fit", 64, length=6, timeout_ms=60_000)
        assert set(batch.episodes) <= set(long)
        total = sum((1 + 2 + 3) * (i + 1) for i in range(len(long)))
        for name, start, p in zip(
            batch.episodes, batch.starts.tolist(), batch.probabilities.tolist(), strict=True
        ):
            want = (start + 1) * (long.index(name) + 1) / total
            assert p == pytest.approx(want, rel=1e-9)
        await rb.drop_table("fit")


def test_the_sync_sharded_client_samples_windows(servers: list[LiveServer]) -> None:
    with ShardedClient([s.url for s in servers]) as rb:
        rb.create_table("sync-spread", episodes={})
        for i in range(4):
            rb.append_steps("sync-spread", f"ep-{i}", steps(5), start=0, end="terminated")
        batch = rb.sample("sync-spread", 16, length=2, n_step=3, allow_partial=True)
        assert batch["step"].shape == (16, 2) and batch.discount is not None
        rb.drop_table("sync-spread")
