"""An in-process app over ``httpx.ASGITransport`` for the rollout-at-scale tests, which can
be stopped and started again on the same data directory (a restart)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from rlreplay.app.main import create_app
from rlreplay.app.settings import Settings


@asynccontextmanager
async def serving(data_dir: Path, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of an app whose lifespan runs for the block (a WAL in ``data_dir``)."""
    options: dict[str, Any] = {"storage_mode": "hybrid", **settings}
    app = create_app(Settings(data_dir=data_dir, **options))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://testserver", timeout=60
        ) as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


async def create(c: httpx.AsyncClient, table: str, **config: Any) -> None:
    """Create ``table`` with a FIFO sampler and ``config``."""
    r = await c.put(f"/v1/tables/{table}", json={"sampler": {"type": "fifo"}, **config})
    assert r.status_code == 201, r.text


async def push(c: httpx.AsyncClient, table: str, items: list[dict[str, Any]], **body: Any) -> Any:
    """Push ``items`` and wait for the writer."""
    r = await c.post(f"/v1/tables/{table}/items", json={"items": items, "wait": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


async def claim(c: httpx.AsyncClient, table: str, status: int = 200, **body: Any) -> Any:
    """A claim answered with ``status``; its JSON body."""
    r = await c.post(f"/v1/tables/{table}/claim", json=body)
    assert r.status_code == status, r.text
    return r.json()
