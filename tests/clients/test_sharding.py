"""Rendezvous hashing: stable owners, about 1/N of the keys move when a shard joins, and the
merging of shards' columnar answers back into the order asked."""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.rendezvous import Rendezvous, hashed_part, normalized_url
from rlreplay.clients.shard_merge import merge_columns, prioritized_weights, shard_masses
from rlreplay.wire.errors import ValidationFailed

URLS = [f"http://replay-{i}.replay:8000" for i in range(4)]
KEYS = [f"episode/{i}/step/{j}" for i in range(200) for j in range(50)]


def test_owners_are_stable_across_runs_and_orders() -> None:
    ring = Rendezvous(URLS[:3])
    owners = [ring.names[i] for i in ring.owners(KEYS)]
    shuffled = Rendezvous([URLS[2], URLS[0], URLS[1]])
    assert [shuffled.names[i] for i in shuffled.owners(KEYS)] == owners
    assert [ring.names[ring.owner(k)] for k in KEYS[:50]] == owners[:50]


def test_pinned_owners_do_not_change_between_processes_or_releases() -> None:
    """BLAKE2b, never Python's salted ``hash()``: every client process agrees, and a new
    release that moved keys would strand the data already on the servers."""
    ring = Rendezvous(["http://a:1", "http://b:1", "http://c:1"])
    assert ring.owners(["k0", "k1", "k2", "k3", "k4", "k5"]).tolist() == [1, 0, 2, 1, 2, 1]


@pytest.mark.parametrize(
    ("key", "hashed"),
    [
        ("{prompt-17}/3", "prompt-17"),
        ("run/{g}/{h}", "g"),  # the first tag only
        ("a{b{c}d}", "b{c"),  # the first "}" after the first "{"
        ("{}/3", "{}/3"),  # an empty tag: the whole key
        ("}{x", "}{x"),  # no "}" after the "{"
        ("{open", "{open"),
        ("plain/key", "plain/key"),
    ],
)
def test_hash_tags_are_hashed_alone_as_redis_cluster_does(key: str, hashed: str) -> None:
    assert hashed_part(key) == hashed


def test_keys_sharing_a_hash_tag_land_on_one_shard_and_tags_spread() -> None:
    ring = Rendezvous(URLS)
    for g in range(50):
        group = [f"{{prompt-{g}}}/{i}" for i in range(8)]
        assert set(ring.owners(group).tolist()) == {ring.owner(f"prompt-{g}")}
    tags = np.bincount(ring.owners([f"{{g{g}}}/0" for g in range(4000)]), minlength=4)
    assert all(abs(c - 1000) < 200 for c in tags), tags


def test_keys_spread_evenly() -> None:
    counts = np.bincount(Rendezvous(URLS).owners(KEYS), minlength=4)
    assert all(abs(c - len(KEYS) / 4) < 0.05 * len(KEYS) for c in counts), counts


@pytest.mark.parametrize("n", [1, 2, 3])
def test_adding_a_shard_moves_about_one_in_n_plus_one_keys_all_to_it(n: int) -> None:
    before = Rendezvous(URLS[:n])
    after = Rendezvous(URLS[: n + 1])
    old = np.array(before.names)[before.owners(KEYS)]
    new = np.array(after.names)[after.owners(KEYS)]
    moved = old != new
    assert set(new[moved].tolist()) == {URLS[n]}  # only to the new shard
    assert moved.mean() == pytest.approx(1 / (n + 1), abs=0.02)


def test_split_keeps_the_order_asked_within_each_shard() -> None:
    ring = Rendezvous(URLS[:3])
    keys = KEYS[:500]
    groups = ring.split(keys)
    assert sorted(np.concatenate(list(groups.values())).tolist()) == list(range(500))
    for shard, places in groups.items():
        assert places.tolist() == sorted(places.tolist())
        assert all(ring.owner(keys[i]) == shard for i in places.tolist())


def test_names_are_checked_and_urls_normalized() -> None:
    with pytest.raises(ValueError, match="distinct"):
        Rendezvous(["http://a", "http://a"])
    with pytest.raises(ValueError, match="at least one"):
        Rendezvous([])
    assert normalized_url("HTTP://Replay-0:8000/") == "http://replay-0:8000"
    with pytest.raises(ValueError, match="scheme"):
        normalized_url("replay-0:8000")


def batch(keys: list[str], **columns: np.ndarray) -> ColumnBatch:
    n = len(keys)
    return ColumnBatch(
        keys=keys,
        columns=dict(columns),
        priorities=np.arange(n, dtype=np.float64),
        times_sampled=np.zeros(n, dtype=np.int64),
    )


def test_merge_scatters_rows_and_variable_length_fields() -> None:
    a = batch(
        ["a0", "a1"],
        x=np.array([[1, 1], [2, 2]]),
        seq=np.array([1, 2, 3, 4, 5]),
        **{"seq.cu_seqlens": np.array([0, 3, 5], dtype=np.int32)},
    )
    b = batch(["b0"], x=np.array([[9, 9]]), seq=np.array([[7, 8]]))  # one length: stacked
    merged = merge_columns([(a, np.array([2, 0])), (b, np.array([1]))], 3)
    assert merged.keys == ["a1", "b0", "a0"]
    assert merged["x"].tolist() == [[2, 2], [9, 9], [1, 1]]
    assert merged["seq"].tolist() == [4, 5, 7, 8, 1, 2, 3]
    assert merged["seq.cu_seqlens"].tolist() == [0, 2, 4, 7]


def test_merge_refuses_fields_that_do_not_match() -> None:
    a = batch(["a"], x=np.zeros((1, 2)))
    b = batch(["b"], y=np.zeros((1, 2)))
    with pytest.raises(ValidationFailed, match="different fields"):
        merge_columns([(a, np.array([0])), (b, np.array([1]))], 2)
    c = batch(["c"], x=np.zeros((1, 2), dtype=np.float32))
    with pytest.raises(ValidationFailed, match="'x'"):
        merge_columns([(a, np.array([0])), (c, np.array([1]))], 2)


def test_shares_by_mass_and_uniform_fallback() -> None:
    stats = [{"draw_mass": 2.0, "selectable": 5}, {"draw_mass": 0.0, "selectable": 3}]
    assert shard_masses(stats).tolist() == [2.0, 0.0]
    zero = [{"draw_mass": 0.0, "selectable": 5}, {"draw_mass": 0.0, "selectable": 3}]
    assert shard_masses(zero).tolist() == [5.0, 3.0]
    with pytest.raises(ValidationFailed, match="draw_mass"):
        shard_masses([{"size": 3}])
    assert prioritized_weights(np.array([0.5, 0.25, 0.125]), 1.0).tolist() == [0.25, 0.5, 1.0]


def test_one_server_client_points_to_the_sharded_one_for_several() -> None:
    from rlreplay import ReplayClient, ShardedReplayClient

    with pytest.raises(TypeError, match="ShardedReplayClient"):
        ReplayClient(["http://a:1", "http://b:1"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="list of server URLs"):
        ShardedReplayClient("http://a:1")


async def test_shard_names_decide_owners_whatever_the_urls() -> None:
    from rlreplay import ShardedReplayClient

    names = ["replay-0", "replay-1", "replay-2"]
    inside = ShardedReplayClient([f"http://{n}.replay:8000" for n in names], shard_names=names)
    outside = ShardedReplayClient(
        [f"http://127.0.0.1:{9000 + i}" for i in range(3)], shard_names=names
    )
    async with inside, outside:
        for key in KEYS[:200]:
            assert inside.urls.index(inside.owner(key)) == outside.urls.index(outside.owner(key))
    with pytest.raises(ValueError, match="2 shard_names for 3 URLs"):
        ShardedReplayClient(outside.urls, shard_names=names[:2])


async def test_bad_keys_and_batch_sizes_are_refused_before_sending() -> None:
    from rlreplay import ShardedReplayClient

    async with ShardedReplayClient(["http://127.0.0.1:1", "http://127.0.0.1:2"]) as rb:
        with pytest.raises(ValidationFailed, match=r"items\[1\]: key"):
            await rb.push("t", [{"key": "a", "value": 1}, {"value": 2}])
        with pytest.raises(ValidationFailed, match="must be a string"):
            await rb.get_many("t", ["a", 3])  # type: ignore[list-item]
        with pytest.raises(ValidationFailed, match="batch_size"):
            await rb.sample("t", 0)
