"""Selection over the wire: a real ``rlreplay serve`` with a fixed ``--seed``.

The same chi-square bar as the in-process tests (p-value under 1e-4 fails), on draws taken
through ``POST /v1/tables/{table}/sample``; reported probabilities and weights are checked
against the contract's formulas, after priority updates and deletes too; the ``score``
plugin (a separate distribution, ``examples/score_sampler``) is used by name.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest
from scipy.stats import chisquare

from tests.live import LiveServer, running_server

P_MIN = 1e-4
MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with running_server(
        tmp_path_factory.mktemp("selection"),
        "--storage-mode",
        "memory",
        "--durability",
        "none",
        "--seed",
        "1234",
    ) as live:
        yield live


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def call(http: httpx.Client, method: str, path: str, body: Any = None) -> Any:
    content = None if body is None else msgpack.packb(body)
    r = http.request(method, path, content=content, headers=MSGPACK)
    assert r.status_code < 300, r.content
    return msgpack.unpackb(r.content) if r.content else None


def draw(http: httpx.Client, table: str, total: int, batch: int = 2000) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while len(out) < total:
        body = {"batch_size": batch, "include_values": False}
        out += call(http, "POST", f"/v1/tables/{table}/sample", body)["items"]
    return out


def assert_follows(picks: list[dict[str, Any]], expected: dict[str, float]) -> None:
    counts = Counter(p["key"] for p in picks)
    assert set(counts) <= set(expected), set(counts) - set(expected)
    keys = sorted(expected)
    observed = np.array([counts.get(k, 0) for k in keys], dtype=np.float64)
    probs = np.array([expected[k] for k in keys])
    assert probs.sum() == pytest.approx(1.0)
    nonzero = probs > 0
    assert observed[~nonzero].sum() == 0, "an item of probability 0 was drawn"
    result = chisquare(observed[nonzero], probs[nonzero] * observed.sum())
    assert result.pvalue > P_MIN, (result, dict(zip(keys, observed.tolist(), strict=True)))


def test_prioritized_over_http(http: httpx.Client) -> None:
    alpha, beta = 0.6, 0.4
    config = {"sampler": {"type": "prioritized", "exponent": alpha, "is_exponent": beta}}
    call(http, "PUT", "/v1/tables/prio", config)
    prios = {f"k{i}": float(i) for i in range(12)}  # k0 has priority 0: never drawn
    items = [{"key": k, "value": {"i": i}, "priority": p} for i, (k, p) in enumerate(prios.items())]
    call(http, "POST", "/v1/tables/prio/items", {"items": items})

    def expected(p: dict[str, float]) -> dict[str, float]:
        mass = {k: v**alpha if v > 0 else 0.0 for k, v in p.items()}
        total = sum(mass.values())
        return {k: m / total for k, m in mass.items()}

    def check(p: dict[str, float]) -> None:
        want = expected(p)
        picks = draw(http, "prio", 60_000)
        assert_follows(picks, want)
        for pick in picks[:2000]:
            assert pick["probability"] == pytest.approx(want[pick["key"]], rel=1e-9)
        batch = call(http, "POST", "/v1/tables/prio/sample", {"batch_size": 64})["items"]
        n = sum(1 for v in p.values() if v >= 0)
        raw = [(n * want[b["key"]]) ** -beta for b in batch]
        for b, w in zip(batch, raw, strict=True):
            assert b["weight"] == pytest.approx(w / max(raw), rel=1e-9)
            assert b["priority"] == p[b["key"]]

    check(prios)
    # after a priority update (one to 0, one way up) and deletes
    changed = {"k3": 0.0, "k5": 40.0, "k7": 0.5}
    answer = call(
        http, "POST", "/v1/tables/prio/priorities", {"priorities": {**changed, "zz": 1.0}}
    )
    assert answer == {"updated": 3, "missing": 1}
    prios.update(changed)
    call(http, "POST", "/v1/tables/prio/items:batchDelete", {"keys": ["k9", "k11"]})
    del prios["k9"], prios["k11"]
    check(prios)


def test_uniform_over_http(http: httpx.Client) -> None:
    call(http, "PUT", "/v1/tables/uni", {"sampler": {"type": "uniform"}})
    keys = [f"u{i}" for i in range(25)]
    call(http, "POST", "/v1/tables/uni/items", {"items": [{"key": k, "value": 0} for k in keys]})
    call(http, "POST", "/v1/tables/uni/items:batchDelete", {"keys": keys[:5]})
    picks = draw(http, "uni", 40_000)
    assert_follows(picks, {k: 1 / 20 for k in keys[5:]})
    assert all(p["probability"] == pytest.approx(1 / 20) and p["weight"] == 1.0 for p in picks)


def test_ptime_over_http(http: httpx.Client) -> None:
    half_life = 0.05
    call(http, "PUT", "/v1/tables/recent", {"sampler": {"type": "ptime", "half_life_s": half_life}})
    for i in range(6):
        call(http, "POST", "/v1/tables/recent/items", {"items": [{"key": f"r{i}", "value": i}]})
        time.sleep(0.02)
    got = call(
        http, "POST", "/v1/tables/recent/items:batchGet", {"keys": [f"r{i}" for i in range(6)]}
    )
    born = {it["key"]: it["inserted_at"] for it in got["items"]}
    newest = max(born.values())
    mass = {k: 2.0 ** ((t - newest) / half_life) for k, t in born.items()}
    want = {k: m / sum(mass.values()) for k, m in mass.items()}
    picks = draw(http, "recent", 40_000)
    assert_follows(picks, want)
    for pick in picks[:500]:
        assert pick["probability"] == pytest.approx(want[pick["key"]], rel=1e-6)


def test_queue_table_over_http(http: httpx.Client) -> None:
    config = {
        "sampler": {"type": "fifo"},
        "remover": {"type": "fifo"},
        "max_times_sampled": 1,
        "rate_limiter": {"type": "queue", "size": 4},
    }
    call(http, "PUT", "/v1/tables/q", config)
    items = [{"key": f"q{i}", "value": i} for i in range(4)]
    call(http, "POST", "/v1/tables/q/items", {"items": items})
    first = call(http, "POST", "/v1/tables/q/sample", {"batch_size": 2})["items"]
    assert [b["key"] for b in first] == ["q0", "q1"]
    call(http, "POST", "/v1/tables/q/items", {"items": [{"key": "q4", "value": 4}]})
    rest = call(http, "POST", "/v1/tables/q/sample", {"batch_size": 3})["items"]
    assert [b["key"] for b in rest] == ["q2", "q3", "q4"]  # first in, first out, once each
    body = msgpack.packb({"batch_size": 1, "timeout_ms": 100})
    empty = http.post("/v1/tables/q/sample", content=body, headers=MSGPACK)
    assert empty.status_code == 504
    assert msgpack.unpackb(empty.content)["error"]["code"] == "deadline_exceeded"


def test_score_plugin_over_http(http: httpx.Client) -> None:
    call(http, "PUT", "/v1/tables/best", {"sampler": {"type": "score"}})
    scores = {"a": 3.0, "b": 9.5, "c": -1.0, "d": 7.0}
    items = [{"key": k, "value": {"score": s, "text": k * 3}} for k, s in scores.items()]
    call(http, "POST", "/v1/tables/best/items", {"items": items})
    top = call(http, "POST", "/v1/tables/best/sample", {"batch_size": 3})["items"]
    assert [t["key"] for t in top] == ["b", "b", "b"]  # deterministic: the best, each draw
    assert top[0]["value"] == {"score": 9.5, "text": "bbb"} and top[0]["probability"] == 1.0
    call(http, "DELETE", "/v1/tables/best/items/b")
    assert call(http, "POST", "/v1/tables/best/sample", {"batch_size": 1})["items"][0]["key"] == "d"
    bad = http.put("/v1/tables/worse", json={"sampler": {"type": "no_such_sampler"}})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "validation_error"


def test_samples_are_reproducible_with_a_seed(tmp_path: Path) -> None:
    def run(workdir: Path) -> list[str]:
        workdir.mkdir()
        flags = ("--storage-mode", "memory", "--seed", "99")
        with running_server(workdir, *flags) as live, httpx.Client(base_url=live.url) as c:
            items = [{"key": f"x{i}", "value": i} for i in range(50)]
            call(c, "POST", "/v1/tables/default/items", {"items": items, "wait": True})
            batch = call(c, "POST", "/v1/tables/default/sample", {"batch_size": 20})["items"]
            return [b["key"] for b in batch]

    first, second = run(tmp_path / "a"), run(tmp_path / "b")
    assert first == second and len(set(first)) > 5
