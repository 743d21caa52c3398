"""Rollout tables at scale: a claim with a ``where`` filter on a large table.

A table of ``N`` rollouts (1,000,000; ``--quick``: 200,000), 1 % of them tagged
``{"ds": "rare"}`` and the rest ``{"ds": "common"}``, each with an int tag ``level``
(0 to 99). One task claims 64 rare rollouts at a time (``where: {"ds": "rare"}``) and
acknowledges each claim, until the rare ones are used up; another claims 64 with a range
(``where: {"level": {"gte": 10, "lt": 11}}``, also 1 %). Next to them, the same task's
claim of 64 without a filter. The claims go through the app's HTTP layer in process
(``httpx.ASGITransport``, JSON), so a figure is the server's whole answer without the
network; each is the median over the claims (the p90 beside it).

The filter is answered from the tag index (value → slots, sorted values for ranges): its
cost follows the matching items, not the table's size.

Run: ``python -m bench.rollout_filters [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.report import print_table
from rlreplay.app.main import create_app
from rlreplay.app.settings import Settings
from rlreplay.app.tables.items import NewItem

_CHUNK = 20_000
_VALUE = b"\x81\xa6tokens\x94\x01\x02\x03\x04"  # {"tokens": [1, 2, 3, 4]}


async def _fill(engine: Any, n: int) -> None:
    tags = [{"ds": "rare" if level == 0 else "common", "level": level} for level in range(100)]
    for start in range(0, n, _CHUNK):
        items = [
            NewItem(f"r{i}", _VALUE, 1.0, None, None, tags[i % 100])
            for i in range(start, min(n, start + _CHUNK))
        ]
        await engine.admission.push("t", items, wait=True, validated=True)


async def _claims(c: httpx.AsyncClient, task: str, where: Any, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        body: dict[str, Any] = {"task": task, "batch_size": 64, "wait_ms": 0, "partial": True}
        if where is not None:
            body["where"] = where
        t0 = time.perf_counter()
        r = await c.post("/v1/tables/t/claim", json=body)
        out.append(time.perf_counter() - t0)
        answer = r.json()
        assert r.status_code == 200 and len(answer["items"]) == 64, r.text[:200]
        await c.post(f"/v1/tables/t/leases/{answer['lease']}:ack")
    return out


async def run(n: int, rounds: int) -> list[list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), storage_mode="memory", durability="none")
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            engine = app.state.engine
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
                r = await c.put("/v1/tables/t", json={"sampler": {"type": "fifo"}})
                assert r.status_code == 201
                t0 = time.perf_counter()
                await _fill(engine, n)
                fill_s = time.perf_counter() - t0
                rows = []
                for name, task, where in (
                    ("where ds == rare (1 %)", "a", {"ds": "rare"}),
                    ("where level in [10, 11) (1 %)", "b", {"level": {"gte": 10, "lt": 11}}),
                    ("no filter", "c", None),
                ):
                    times = await _claims(c, task, where, rounds)
                    times.sort()
                    rows.append(
                        [
                            f"{n:,}",
                            name,
                            f"{statistics.median(times) * 1e3:.2f}",
                            f"{times[int(len(times) * 0.9)] * 1e3:.2f}",
                        ]
                    )
                print(f"filled {n:,} rollouts in {fill_s:.1f} s")
                return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rollout_filters")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    n = 200_000 if args.quick else 1_000_000
    rounds = 30 if args.quick else 150
    rows = asyncio.run(run(n, rounds))
    print_table(
        "Claim of 64 with a where filter (in-process HTTP, JSON, claim + ack per round)",
        ["rollouts", "claim", "median ms", "p90 ms"],
        rows,
    )


if __name__ == "__main__":
    main()
