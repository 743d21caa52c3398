"""The TorchRL adapter against a live server, with TorchRL's own replay-buffer tests.

Vendored from pytorch/rl ``test/rb/test_rb_core.py`` (``TestBuffers``) and
``test/rb/test_prioritized.py`` (``test_prb``, ``test_ptdrb``), adapted: the buffer under
test is :class:`~rlreplay.clients.torchrl_buffer.TableReplayBuffer` on a uniform table
(where TorchRL's is a ``TensorDictReplayBuffer``) or on a prioritized one (a
``TensorDictPrioritizedReplayBuffer``, alpha 0.7, beta 0.9), and a storage of capacity 5
is a table of ``max_size`` 5 with a FIFO remover. The other tests there do not apply (see
docs/use-from.md, "TorchRL"): they assert on TorchRL's own parts (the writer's cursor,
``rb.storage`` and positional ``rb[i]``, the segment trees, the RNG's state, transforms,
prefetching, consumption), or that a sample aliases the tensors that were extended (a
``ListStorage`` keeps references; a server keeps copies).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
tensordict = pytest.importorskip("tensordict")

import numpy as np  # noqa: E402
from tensordict import TensorDict, TensorDictBase  # noqa: E402

import rlreplay  # noqa: E402
from rlreplay.clients.torchrl_buffer import TableReplayBuffer  # noqa: E402
from tests.live import running_server  # noqa: E402

UNIFORM = {"sampler": {"type": "uniform"}}
PRIORITIZED = {"sampler": {"type": "prioritized", "exponent": 0.7, "is_exponent": 0.9}}
KINDS = {"uniform": UNIFORM, "prioritized": PRIORITIZED}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[rlreplay.Client]:
    workdir: Path = tmp_path_factory.mktemp("torchrl-server")
    with running_server(workdir, "--no-default-table") as server:
        with rlreplay.Client(server.url) as rb:
            yield rb


_tables = iter(range(1_000_000))


def make_rb(client: rlreplay.Client, kind: str, *, size: int = 100, **kw: Any) -> TableReplayBuffer:
    config = {**KINDS[kind], "max_size": size, "remover": {"type": "fifo"}}
    return TableReplayBuffer(
        client, f"t{next(_tables)}", batch_size=kw.pop("batch_size", 3), create=config, **kw
    )


def get_datum() -> TensorDict:
    return TensorDict({"a": torch.randint(100, (1,))}, [])


def get_data(size: int) -> TensorDict:
    return TensorDict(
        {
            "a": torch.randint(100, (size,)),
            "b": TensorDict({"c": torch.randint(100, (size,))}, [size]),
        },
        [size],
    )


def matches(d: TensorDictBase, b: TensorDictBase) -> bool:
    keys = set(d.keys()) & set(b.keys())
    b = b.exclude("index").select(*keys, strict=False)
    keys = set(d.keys()) & set(b.keys())
    return bool((b == d.select(*keys, strict=False)).all())


# --- TestBuffers (test_rb_core.py), for TensorDictReplayBuffer and the prioritized one ---


@pytest.mark.parametrize("kind", list(KINDS))
def test_add(client: rlreplay.Client, kind: str) -> None:
    torch.manual_seed(0)
    rb = make_rb(client, kind)
    data = get_datum()
    rb.add(data)
    s = rb.sample(1)[0]
    s = s.select(*data.keys(True), strict=False)
    data = data.select(*s.keys(True), strict=False)
    assert (s == data).all()
    assert list(s.keys(True, True))


@pytest.mark.parametrize("kind", list(KINDS))
def test_empty(client: rlreplay.Client, kind: str) -> None:
    torch.manual_seed(0)
    rb = make_rb(client, kind)
    data = get_datum()
    for _ in range(2):
        rb.add(data)
        s = rb.sample(1)[0]
        s = s.select(*data.keys(True), strict=False)
        assert (s == data.select(*s.keys(True), strict=False)).all()
        rb.empty()
        assert len(rb) == 0
        # TorchRL raises RuntimeError("Cannot sample from an empty storage"); a table's
        # sample waits for items and then says its deadline passed
        with pytest.raises(rlreplay.DeadlineExceeded):
            rb._client.sample(rb.table, 1, timeout_ms=50)


@pytest.mark.parametrize("size", [3, 5, 100])
@pytest.mark.parametrize("kind", list(KINDS))
def test_extend(client: rlreplay.Client, kind: str, size: int) -> None:
    torch.manual_seed(0)
    rb = make_rb(client, kind, size=size)
    data = get_data(5)
    rb.extend(data)
    length = len(rb)
    assert length == min(size, 5)
    # every item kept is one of the last ``length`` extended (rb.storage: get_many)
    stored = client.get_many(rb.table, rb._keys(data["index"][-length:]), layout="columns")
    assert stored.missing == []
    stored_td = stored.to_tensordict()
    for d in data[-length:]:
        assert any(matches(d, b) for b in stored_td), "did not find match"


@pytest.mark.parametrize("size", [3, 5, 100])
@pytest.mark.parametrize("kind", list(KINDS))
def test_sample(client: rlreplay.Client, kind: str, size: int) -> None:
    torch.manual_seed(0)
    rb = make_rb(client, kind, size=size)
    data = get_data(5)
    rb.extend(data)
    new_data = rb.sample()
    assert isinstance(new_data, TensorDictBase) and new_data.batch_size == torch.Size([3])
    for d in new_data:
        assert any(matches(d, b) for b in data), "did not find matching value"


# --- test_prb / test_ptdrb (test_prioritized.py) -----------------------------------------


@pytest.mark.parametrize("priority_key", ["pk", "td_error"])
def test_prb(client: rlreplay.Client, priority_key: str) -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    rb = make_rb(client, "prioritized", size=5, batch_size=5, priority_key=priority_key)
    td1 = TensorDict(
        source={
            "a": torch.randn(3, 1),
            priority_key: torch.rand(3, 1) / 10,
            "_idx": torch.arange(3).view(3, 1),
        },
        batch_size=[3],
    )
    rb.extend(td1)
    s = rb.sample()
    assert s.batch_size == torch.Size([5])
    assert (td1[s.get("_idx").squeeze()].get("a") == s.get("a")).all()
    torch.testing.assert_close(td1[s.get("_idx").squeeze()].get("a"), s.get("a"))

    # test replacement
    td2 = TensorDict(
        source={
            "a": torch.randn(5, 1),
            priority_key: torch.rand(5, 1) / 10,
            "_idx": torch.arange(5).view(5, 1),
        },
        batch_size=[5],
    )
    rb.extend(td2)
    s = rb.sample()
    assert s.batch_size == torch.Size([5])
    assert (td2[s.get("_idx").squeeze()].get("a") == s.get("a")).all()
    assert (s.get("_weight") > 0).all() and (s.get("_weight") <= 1).all()

    # test strong update
    idx = s.get("_idx")
    idx_match = (idx == idx[0]).nonzero()[:, 0]
    s.set_at_(priority_key, torch.ones(idx_match.numel(), 1) * 100000000, idx_match)
    val = s.get("a")[0]
    idx0 = s.get("_idx")[0]
    rb.update_tensordict_priority(s)
    s = rb.sample()
    assert (val == s.get("a")).sum() >= 1
    torch.testing.assert_close(td2[idx0].get("a").view(1), s.get("a").unique().view(1))
    # (TorchRL's last step, "updating values of the original td" shows in a sample, asserts
    # that ListStorage aliases what was extended: a server holds copies.)


@pytest.mark.parametrize("priority_key", ["pk", "td_error"])
def test_update_priority_by_index(client: rlreplay.Client, priority_key: str) -> None:
    """``update_priority(index, priority)``, TorchRL's other form of the strong update."""
    rb = make_rb(client, "prioritized", size=5, batch_size=8, priority_key=priority_key)
    index = rb.extend(TensorDict({"a": torch.arange(5.0)}, [5]))
    rb.update_priority(index[3], 1e8)
    assert set(rb.sample()["a"].tolist()) == {3.0}


# --- test_replay_buffer_trajectories (test_prioritized.py): items of [T] steps -----------


@pytest.mark.parametrize("stack", [False, True])
def test_replay_buffer_trajectories(client: rlreplay.Client, stack: bool) -> None:
    # TorchRL's "tb" datatype; its reduction "max" (the table keeps one priority per item,
    # the largest of its steps'; TorchRL's min, median and mean reductions are not offered)
    traj_td = TensorDict(
        {"obs": torch.randn(3, 4, 5), "actions": torch.randn(3, 4, 2)}, batch_size=[3, 4]
    )
    if stack:
        traj_td = torch.stack(list(traj_td), 0)
    rb = make_rb(client, "prioritized", size=5, batch_size=3)
    rb.extend(traj_td)
    sampled_td = rb.sample()
    assert sampled_td.batch_size == torch.Size([3, 4])
    sampled_td.set("td_error", torch.rand(sampled_td.shape))
    rb.update_tensordict_priority(sampled_td)
    sampled_td = rb.sample()
    assert (sampled_td.get("priority_weight") > 0).all()
    assert sampled_td.batch_size == torch.Size([3, 4])
    # and the priority set is the largest of the steps' TD errors
    errors = torch.rand(sampled_td.shape)
    sampled_td.set("td_error", errors)
    rb.update_tensordict_priority(sampled_td)
    again = client.get_many(rb.table, rb._keys(sampled_td["index"][:, 0]), layout="columns")
    expected = dict(zip(again.keys, errors.amax(dim=1).double().tolist(), strict=False))
    assert again.priorities.tolist() == pytest.approx([expected[k] for k in again.keys])


# --- what TorchRL code reads of a buffer --------------------------------------------------


def test_index_weight_and_state_dict(client: rlreplay.Client) -> None:
    rb = make_rb(client, "uniform", batch_size=4, writer_id=7)
    data = TensorDict({"obs": torch.randn(6, 3), ("next", "obs"): torch.randn(6, 3)}, [6])
    index = rb.extend(data)
    assert torch.equal(data["index"], index) and rb.write_count == 6
    s, info = rb.sample(return_info=True)
    assert s["next", "obs"].shape == (4, 3)
    assert torch.equal(s["index"], info["index"]) and (s["_weight"] == 1).all()
    assert torch.equal(s["priority_weight"], s["_weight"])
    for i, row in zip(s["index"].tolist(), s, strict=True):
        assert torch.equal(row["obs"], data[i - (7 << 40)]["obs"])
    state = rb.state_dict()
    again = TableReplayBuffer(client, "other", writer_id=0)
    again.load_state_dict(state)
    assert again.table == rb.table and int(again.extend(data[:1])[0]) == (7 << 40) + 6


def test_push_columns_takes_a_tensordict(client: rlreplay.Client) -> None:
    client.create_table("td-columns", sampler={"type": "fifo"})
    td = TensorDict({"obs": torch.arange(6.0).view(3, 2), "next": {"r": torch.ones(3)}}, [3])
    assert client.push_columns("td-columns", ["a", "b", "c"], td, wait=True) == 3
    back = client.get_many("td-columns", ["a", "b", "c"], layout="columns").to_tensordict()
    assert back.batch_size == torch.Size([3])
    assert torch.equal(back["obs"], td["obs"]) and torch.equal(back["next", "r"], td["next", "r"])


def test_sequences_from_an_episode_table(client: rlreplay.Client) -> None:
    import rlreplay.torchrl

    client.create_table("td-episodes", sampler={"type": "uniform"}, episodes={})
    steps = {"obs": torch.arange(10.0).view(10, 1).numpy(), "reward": torch.ones(10).numpy()}
    client.append_steps(
        "td-episodes", "e0", steps, start=0, end="terminated", final={"obs": [10.0]}, wait=True
    )
    rb = rlreplay.torchrl.TableReplayBuffer(client, "td-episodes", batch_size=5)
    windows = rb.sample_windows(length=4)
    assert windows.batch_size == torch.Size([5, 4])
    first = windows["start"][:, :1]
    assert torch.equal(windows["obs"][..., 0], first + torch.arange(4.0))
    assert windows["mask"].all() and (windows["_weight"] == 1).all()
    nstep = rb.sample_windows(length=1, n_step=2, gamma=0.5, next_fields=["obs"])
    start = nstep["start"][:, 0]
    assert torch.equal(nstep["next", "obs"][:, 0, 0], (start + 2).clamp(max=10).double())
    assert torch.allclose(nstep["returns"][:, 0], torch.where(start < 9, 1.5, 1.0).double())
