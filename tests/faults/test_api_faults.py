"""Out-of-range numbers anywhere in a body answer 422 with the field named, and change
nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from rlreplay.app.main import create_app
from rlreplay.app.settings import Settings

HUGE = "1" + "0" * 400  # an integer past 64 bits, and past a float's range
JSON = {"content-type": "application/json"}


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(data_dir=tmp_path / "data"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            yield c


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"max_size": 1000000000000000000000000000000}', "max_size"),
        ('{"max_times_sampled": 18446744073709551616}', "max_times_sampled"),
        ('{"rate_limiter": {"type": "min_size", "min_size": BIG}}', "min_size"),
        ('{"rate_limiter": {"type": "queue", "size": BIG}}', "size"),
        (
            '{"rate_limiter": {"type": "sample_to_insert_ratio", "error_buffer": BIG}}',
            "error_buffer",
        ),
        (
            '{"rate_limiter": {"type": "sample_to_insert_ratio", "samples_per_insert": 1e400}}',
            "samples_per_insert",
        ),
        ('{"sampler": {"type": "prioritized", "exponent": 1e400}}', "exponent"),
        ('{"sampler": {"type": "ptime", "half_life_s": BIG}}', "half_life_s"),
    ],
)
async def test_config_numbers_out_of_range(
    client: httpx.AsyncClient, body: str, field: str
) -> None:
    r = await client.put("/v1/tables/t", content=body.replace("BIG", HUGE), headers=JSON)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "validation_error"
    assert field in r.json()["error"]["message"]
    assert (await client.get("/v1/tables/t")).status_code == 404


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (
            "/v1/tables/default/items",
            '{"items": [{"key": "a", "value": 1, "priority": BIG}]}',
            "items[0].priority",
        ),
        (
            "/v1/tables/default/items",
            '{"items": [{"key": "a", "value": {"x": [1, BIG]}}]}',
            "items[0].value",
        ),
        ("/v1/tables/default/priorities", '{"priorities": {"a": BIG}}', "priorities"),
        ("/v1/tables/default/sample", '{"batch_size": BIG}', "batch_size"),
        ("/v1/tables/default/sample", '{"batch_size": 1, "timeout_ms": BIG}', "timeout_ms"),
    ],
)
async def test_body_numbers_out_of_range(
    client: httpx.AsyncClient, path: str, body: str, field: str
) -> None:
    r = await client.post(path, content=body.replace("BIG", HUGE), headers=JSON)
    assert r.status_code == 422, r.text
    assert field in r.json()["error"]["message"]
    assert (await client.get("/v1/tables/default/items/a")).status_code == 404


async def test_a_dead_writer_makes_healthz_503(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So that an orchestrator restarts the process; /metrics says so too."""
    assert (await client.get("/healthz")).status_code == 200
    app = client._transport.app  # type: ignore[attr-defined]
    processor = app.state.engine._processor

    async def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in the writer")

    monkeypatch.setattr(processor, "apply", boom)
    r = await client.post(
        "/v1/tables/default/items", json={"items": [{"key": "a", "value": 1}], "wait": True}
    )
    assert r.status_code == 500
    for _ in range(500):
        r = await client.get("/healthz")
        if r.status_code != 200:
            break
        await asyncio.sleep(0.01)
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "unavailable"
    assert "writer" in r.json()["error"]["message"]
    assert (await client.get("/readyz")).status_code == 503
    text = (await client.get("/metrics")).text  # the first scrape: nothing cached yet
    assert "rlreplay_writer_alive 0" in text
