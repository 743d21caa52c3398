"""``/metrics``: who may scrape it, and what a scrape exports when tables are many.

How much event-loop time a scrape costs is measured by ``python -m bench.metrics``, not
asserted here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rlreplay.app.main import create_app
from rlreplay.app.metrics import Metrics
from rlreplay.app.settings import Settings
from rlreplay.app.tables.stats import STAT_NAMES, TablesSummary
from tests.api.test_cli import parse as parse_flags
from tests.api.test_errors import assert_error

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@asynccontextmanager
async def serving(tmp_path: Path, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an in-process app (memory mode) with these settings."""
    app = create_app(Settings(data_dir=tmp_path / "data", storage_mode="memory", **settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            yield c


def parse(text: str) -> Samples:
    """Every sample of a scrape, by (name, sorted labels); fails unless the text parses."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"{key} twice"
            out[key] = s.value
    return out


def per_table(samples: Samples, name: str) -> dict[str, float]:
    return {dict(labels)["table"]: v for (n, labels), v in samples.items() if n == name}


async def test_metrics_needs_a_key_with_the_flag(tmp_path: Path) -> None:
    async with serving(tmp_path, api_key=["alpha", "beta"], metrics_require_key=True) as c:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "alpha"}):
            r = await c.get("/metrics", headers=headers)
            assert_error(r, 401, "unauthorized")
            assert r.headers["www-authenticate"] == "Bearer"
            assert_error(await c.get("/v1/tables", headers=headers), 401, "unauthorized")
        for key in ("alpha", "beta"):
            r = await c.get("/metrics", headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200
            assert "rlreplay_all_tables_items" in r.text
        for path in ("/healthz", "/readyz"):
            assert (await c.get(path)).status_code == 200, path


@pytest.mark.parametrize(
    "settings",
    [
        {"api_key": ["alpha"]},  # keys, but not for /metrics
        {"metrics_require_key": True},  # the flag, but no keys to require
    ],
)
async def test_metrics_stays_open_unless_the_flag_and_keys_are_set(
    tmp_path: Path, settings: dict[str, Any]
) -> None:
    async with serving(tmp_path, **settings) as c:
        r = await c.get("/metrics")
        assert r.status_code == 200
        assert 'rlreplay_table_items{table="default"} 0.0' in r.text


def test_the_flag_is_on_the_command_line() -> None:
    assert parse_flags().metrics_require_key is False
    assert parse_flags("--metrics-require-key").metrics_require_key is True
    assert parse_flags("--metrics-max-tables", "none").metrics_max_tables is None
    assert (
        parse_flags("--metrics-max-tables", "7", "--metrics-cache-s", "0").metrics_max_tables == 7
    )


async def fill(c: httpx.AsyncClient, sizes: dict[str, int]) -> None:
    """Creates the tables and pushes ``sizes[name]`` items into each, waiting for the writer."""
    for name, n in sizes.items():
        assert (await c.put(f"/v1/tables/{name}", json={"sampler": {"type": "fifo"}})).is_success
        items = [{"key": f"k{i}", "value": i} for i in range(n)]
        if items:
            r = await c.post(f"/v1/tables/{name}/items", json={"items": items, "wait": True})
            assert r.status_code == 200, r.text


SIZES = {"t1": 5, "t2": 1, "t3": 7, "t4": 3, "t5": 0, "t6": 7, "t7": 2}  # and "default": 0


async def test_a_capped_scrape_has_the_totals_and_the_largest_tables(tmp_path: Path) -> None:
    async with serving(tmp_path, metrics_max_tables=3, metrics_cache_s=0) as c:
        await fill(c, SIZES)
        samples = parse((await c.get("/metrics")).text)
        assert samples[("rlreplay_tables", ())] == len(SIZES) + 1
        assert samples[("rlreplay_tables_exported", ())] == 3
        # the three largest; t3 and t6 tie, both in
        assert per_table(samples, "rlreplay_table_items") == {"t3": 7.0, "t6": 7.0, "t1": 5.0}
        assert per_table(samples, "rlreplay_table_inserts_total") == {"t3": 7, "t6": 7, "t1": 5}
        for stat in ("pending_ops", "bytes_in_cache", "bytes_on_disk", "deletes_total"):
            assert set(per_table(samples, f"rlreplay_table_{stat}")) == {"t3", "t6", "t1"}
        assert samples[("rlreplay_all_tables_items", ())] == sum(SIZES.values())
        assert samples[("rlreplay_all_tables_inserts_total", ())] == sum(SIZES.values())
        assert samples[("rlreplay_all_tables_bytes_in_cache", ())] > 0
        assert ("rlreplay_write_queue_depth", (("queue", "urgent"),)) in samples
        assert ("rlreplay_cache_bytes", ()) in samples

        # the request metrics are in the same scrape
        assert samples[("rlreplay_ops_total", (("kind", "push_items"), ("outcome", "ok")))] == 6

        # a dropped table leaves the table counters' totals as they were
        assert (await c.delete("/v1/tables/t3")).status_code == 204
        samples = parse((await c.get("/metrics")).text)
        assert samples[("rlreplay_all_tables_inserts_total", ())] == sum(SIZES.values())
        assert samples[("rlreplay_all_tables_items", ())] == sum(SIZES.values()) - 7
        assert per_table(samples, "rlreplay_table_items") == {"t6": 7, "t1": 5, "t4": 3}


@pytest.mark.parametrize(
    ("max_tables", "exported"),
    [(None, {*SIZES, "default"}), (0, set()), (100, {*SIZES, "default"})],
)
async def test_the_cap_picks_which_tables_have_series(
    tmp_path: Path, max_tables: int | None, exported: set[str]
) -> None:
    async with serving(tmp_path, metrics_max_tables=max_tables, metrics_cache_s=0) as c:
        await fill(c, SIZES)
        samples = parse((await c.get("/metrics")).text)
        assert samples[("rlreplay_tables_exported", ())] == len(exported)
        got = per_table(samples, "rlreplay_table_items")
        assert got == {name: float(SIZES.get(name, 0)) for name in exported}
        assert samples[("rlreplay_all_tables_items", ())] == sum(SIZES.values())


async def test_a_rendering_is_reused_for_cache_s(tmp_path: Path) -> None:
    async with serving(tmp_path, metrics_cache_s=3600) as c:
        first = (await c.get("/metrics")).text
        await fill(c, {"later": 2})
        assert (await c.get("/metrics")).text == first
    async with serving(tmp_path / "fresh", metrics_cache_s=0) as c:
        await c.get("/metrics")
        await fill(c, {"later": 2})
        assert 'rlreplay_table_items{table="later"} 2.0' in (await c.get("/metrics")).text


class FakeEngine:
    """An engine view with odd table names and values, for the text format's corners."""

    def __init__(self, summary: Callable[[int | None], TablesSummary]) -> None:
        self.tables_summary = summary
        self.writer_lag_s = float("inf")

    def queue_depths(self) -> dict[str, int]:
        return {"urgent": 0}

    def storage_stats(self) -> dict[str, Any]:
        return {"cache_bytes": 10**17}


def test_label_values_and_numbers_are_spelled_as_the_text_format_asks() -> None:
    odd = 'we"ird\\name\nx'
    values = tuple(range(len(STAT_NAMES)))
    metrics = Metrics()
    metrics.watch_engine(
        FakeEngine(lambda largest: TablesSummary(1, values, [(odd, values)])), max_tables=None
    )
    samples = parse(metrics.render().decode())
    assert per_table(samples, "rlreplay_table_pending_ops") == {odd: 1.0}
    assert samples[("rlreplay_cache_bytes", ())] == 1e17
    assert samples[("rlreplay_writer_lag_seconds", ())] == float("inf")


def test_max_tables_and_cache_s_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match=r"max_tables \(-1\) must be >= 0"):
        Metrics().watch_engine(FakeEngine(lambda _: TablesSummary(0, ())), max_tables=-1)
    with pytest.raises(ValueError, match=r"cache_s \(-1\) must be >= 0"):
        Metrics(cache_s=-1)


async def test_the_schema_documents_the_401(tmp_path: Path) -> None:
    async with serving(tmp_path) as c:
        schema = (await c.get("/openapi.json")).json()
    assert "401" in schema["paths"]["/metrics"]["get"]["responses"]
