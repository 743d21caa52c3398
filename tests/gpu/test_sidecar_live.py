"""A real ``rlreplay serve`` and a real ``rlreplay sidecar`` following it: batches served
by the sidecar equal the pushed values by key, deletes and priority updates on the server
reach it, its draws pass the server's chi-square bar, and it recovers when the server is
killed and restarted under it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from rlreplay import ReplayDataset
from rlreplay.app.cli import serve_command
from rlreplay.wire.codec import packb, unpackb
from tests.gpu.test_sampler import assert_columns_match, assert_follows, value_of
from tests.live import REPO, LiveServer, free_port, running_server, start_server, stop_server

MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}
DEADLINE_S = 20.0


@contextlib.contextmanager
def running_sidecar(workdir: Path, server: str, table: str) -> Iterator[str]:
    """``python -m rlreplay sidecar`` on the CPU, on 127.0.0.1, until ``/healthz`` answers."""
    port = free_port()
    log_path = workdir / f"sidecar-{port}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLREPLAY_")}
    cmd = [sys.executable, "-m", "rlreplay", "sidecar", "--server", server, "--table", table]
    cmd += ["--device", "cpu", "--host", "127.0.0.1", "--port", str(port), "--seed", "7"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: get(url, "/healthz").status_code == 200, what=log_path)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def get(url: str, path: str) -> httpx.Response:
    try:
        return httpx.get(url + path, timeout=10)
    except httpx.HTTPError:
        return httpx.Response(599)


def wait_for(condition: Callable[[], bool], *, what: Any) -> None:
    """Waits for ``condition`` with a generous deadline (a busy box may be slow)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    text = what.read_text(errors="replace") if isinstance(what, Path) else what
    raise AssertionError(f"not true within {DEADLINE_S} s: {text}")


def call(url: str, method: str, path: str, body: Any = None) -> Any:
    r = httpx.request(method, url + path, content=packb(body), headers=MSGPACK, timeout=30)
    assert r.status_code < 300, r.content
    return unpackb(r.content) if r.content else None


def sample(url: str, batch_size: int, strategy: str, fields: list[str] | None = None) -> Any:
    body = {"batch_size": batch_size, "strategy": strategy, "fields": fields or []}
    return call(url, "POST", "/v1/sample", body)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    flags = ("--storage-mode", "memory", "--durability", "none", "--changes-keep", "500")
    with running_server(tmp_path_factory.mktemp("sidecar-server"), *flags) as live:
        yield live


def test_the_sidecar_serves_the_servers_items(server: LiveServer, tmp_path: Path) -> None:
    config = {"sampler": {"type": "prioritized", "exponent": 1.0, "is_exponent": 0.5}}
    call(server.url, "PUT", "/v1/tables/live", config)
    pushed = {f"s{i}": value_of(i) for i in range(30)}
    items = [
        {"key": k, "value": v, "priority": float(i + 1)} for i, (k, v) in enumerate(pushed.items())
    ]
    call(server.url, "POST", "/v1/tables/live/items", {"items": items, "wait": True})
    with running_sidecar(tmp_path, server.url, "live") as sidecar:
        wait_for(lambda: get(sidecar, "/readyz").status_code == 200, what="readyz")
        batch = sample(sidecar, 100, "prioritized", ["obs", "tokens", "reward"])
        keys, cols = batch["keys"], batch["columns"]
        assert len(keys) == 100 and batch["weights"].shape == (100,)
        cu = cols["tokens.cu_seqlens"]
        assert cu.dtype == np.int32 and len(cu) == 101 and cu[-1] == len(cols["tokens"])
        for row, key in enumerate(keys):
            np.testing.assert_array_equal(cols["obs"][row], pushed[key]["obs"])
            np.testing.assert_array_equal(
                cols["tokens"][cu[row] : cu[row + 1]], pushed[key]["tokens"]
            )
            assert cols["reward"][row] == pushed[key]["reward"]

        # the server's distribution, through the process
        counts: Counter[str] = Counter()
        while sum(counts.values()) < 120_000:
            counts.update(sample(sidecar, 4096, "prioritized")["keys"])
        total = sum(range(1, 31))
        assert_follows(counts, {f"s{i}": (i + 1) / total for i in range(30)})

        # a priority update and deletes on the server reach the sidecar
        call(server.url, "POST", "/v1/tables/live/priorities", {"priorities": {"s3": 1000.0}})
        wait_for(lambda: sample(sidecar, 1, "topk")["keys"] == ["s3"], what="priority update")
        gone = ["s3", "s29", "s28"]
        call(server.url, "POST", "/v1/tables/live/items:batchDelete", {"keys": gone})
        wait_for(lambda: sample(sidecar, 1, "topk")["keys"] == ["s27"], what="deletes")
        seen = set(sample(sidecar, 4096, "uniform")["keys"])
        assert seen == set(pushed) - set(gone)
        metrics = get(sidecar, "/metrics").text
        assert 'rlreplay_sidecar_items{device="cpu",table="live"} 27.0' in metrics
        assert (
            "rlreplay_sidecar_lag_events" in metrics
            and "rlreplay_sidecar_select_seconds" in metrics
        )
        bad = httpx.post(sidecar + "/v1/sample", json={"batch_size": 0}, timeout=10)
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "validation_error"


def test_uniform_and_ptime_draws_through_the_process_pass_the_bar(
    server: LiveServer, tmp_path: Path
) -> None:
    call(server.url, "PUT", "/v1/tables/plain", {"sampler": {"type": "uniform"}})
    keys = [f"p{i}" for i in range(20)]
    items = [{"key": k, "value": {"reward": float(i)}} for i, k in enumerate(keys)]
    call(server.url, "POST", "/v1/tables/plain/items", {"items": items, "wait": True})
    half_life = 0.05
    call(
        server.url,
        "PUT",
        "/v1/tables/recent",
        {"sampler": {"type": "ptime", "half_life_s": half_life}},
    )
    for i in range(6):  # inserted 20 ms apart: a few half-lives between the first and last
        body = {"items": [{"key": f"r{i}", "value": {"reward": float(i)}}], "wait": True}
        call(server.url, "POST", "/v1/tables/recent/items", body)
        time.sleep(0.02)
    got = call(
        server.url,
        "POST",
        "/v1/tables/recent/items:batchGet",
        {"keys": [f"r{i}" for i in range(6)]},
    )
    born = {item["key"]: item["inserted_at"] for item in got["items"]}
    newest = max(born.values())
    mass = {k: 2.0 ** ((t - newest) / half_life) for k, t in born.items()}
    with running_sidecar(tmp_path, server.url, "plain") as sidecar:
        wait_for(lambda: get(sidecar, "/readyz").status_code == 200, what="readyz")
        counts: Counter[str] = Counter()
        while sum(counts.values()) < 40_000:
            batch = sample(sidecar, 4096, "uniform")
            counts.update(batch["keys"])
        assert_follows(counts, {k: 1 / 20 for k in keys})
        assert np.all(batch["probabilities"] == 1 / 20)
    with running_sidecar(tmp_path, server.url, "recent") as sidecar:
        wait_for(lambda: get(sidecar, "/readyz").status_code == 200, what="readyz")
        counts = Counter()
        while sum(counts.values()) < 40_000:
            batch = sample(sidecar, 4096, "ptime")
            counts.update(batch["keys"])
        want = {k: m / sum(mass.values()) for k, m in mass.items()}
        assert_follows(counts, want)
        for key, p in zip(batch["keys"], batch["probabilities"].tolist(), strict=True):
            assert p == pytest.approx(want[key], rel=1e-6)


def test_a_training_loop_iterates_the_dataset(server: LiveServer) -> None:
    call(server.url, "PUT", "/v1/tables/train", {"sampler": {"type": "uniform"}})
    pushed = {f"t{i}": value_of(i) for i in range(25)}
    items = [{"key": k, "value": v} for k, v in pushed.items()]
    call(server.url, "POST", "/v1/tables/train/items", {"items": items, "wait": True})
    dataset = ReplayDataset(
        server.url, "train", batch_size=16, fields=["obs", "tokens"], seed=3, prefetch=2
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=None)
    with dataset.iterate() as batches:
        for _, batch in zip(range(4), batches, strict=False):
            assert len(batch.keys) == 16
            assert_columns_match(
                batch.keys, batch.columns | {"reward": _rewards(batch.keys, pushed)}, pushed
            )
    first = next(iter(loader))
    assert len(first.keys) == 16 and first.columns["obs"].shape == (16, 2, 3)


def _rewards(keys: list[str], pushed: dict[str, Any]) -> torch.Tensor:
    return torch.tensor([pushed[k]["reward"] for k in keys])


def test_the_sidecar_recovers_when_the_server_restarts(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "data"
    flags = ("--storage-mode", "hybrid", "--changes-keep", "100")

    def launch() -> LiveServer:
        return start_at(tmp_path, port, data, *flags)

    live = launch()
    try:
        call(live.url, "PUT", "/v1/tables/r", {"sampler": {"type": "uniform"}})
        first = [{"key": f"a{i}", "value": value_of(i)} for i in range(20)]
        call(live.url, "POST", "/v1/tables/r/items", {"items": first, "wait": True})
        with running_sidecar(tmp_path, live.url, "r") as sidecar:
            wait_for(lambda: get(sidecar, "/readyz").status_code == 200, what="readyz")
            live.process.send_signal(signal.SIGKILL)
            live.process.wait(10)
            wait_for(
                lambda: get(sidecar, "/readyz").status_code == 503, what="not ready while down"
            )
            live = launch()  # the same port and data: the log brings the items back
            more = [{"key": f"b{i}", "value": value_of(i)} for i in range(15)]
            call(live.url, "POST", "/v1/tables/r/items", {"items": more, "wait": True})
            call(live.url, "POST", "/v1/tables/r/items:batchDelete", {"keys": ["a0", "a1"]})
            index = call(live.url, "GET", "/v1/tables/r/index")
            want = index["keys"]
            assert len(want) == 33

            def exact() -> bool:
                if get(sidecar, "/readyz").status_code != 200:
                    return False
                return sample(sidecar, len(want), "fifo")["keys"] == want

            wait_for(exact, what="the sidecar holds the restarted server's state")
            batch = sample(sidecar, 64, "uniform", ["obs"])
            values = {
                **{f"a{i}": value_of(i) for i in range(20)},
                **{f"b{i}": value_of(i) for i in range(15)},
            }
            for row, key in enumerate(batch["keys"]):
                np.testing.assert_array_equal(batch["columns"]["obs"][row], values[key]["obs"])
    finally:
        stop_server(live)


def start_at(workdir: Path, port: int, data: Path, *flags: str) -> LiveServer:
    """A server on a given port (a restart keeps its URL), ready."""
    cmd = serve_command(port, data, *flags)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLREPLAY_")}
    log_path = workdir / f"server-{time.monotonic_ns()}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    live = LiveServer(f"http://127.0.0.1:{port}", process, log_path, data)
    wait_for(lambda: get(live.url, "/readyz").status_code == 200, what=log_path)
    return live


__all__ = ["start_server"]
