"""Sampling throughput through the client, against the engine's own rate.

Run: ``.venv/bin/python -m bench.stream_cpu [--seconds 3] [--batch-size 64]``

It fills a uniform table with 256 items of 4 KiB (a ``|u1`` array each) and reports items/s:

* the engine's own rate: ``Engine.sample`` in-process, no HTTP (the ceiling);
* sequential ``ReplayClient.sample`` calls, one at a time;
* ``ReplayClient.stream`` with several ``prefetch`` depths;
* several concurrent callers sharing one client (``max_connections`` up to 16, and 64);
* the client alone: sequential ``sample`` and ``stream`` against a stub HTTP server that
  answers every request with the same pre-encoded batch (the client's own ceiling).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlreplay.clients import ReplayClient, tune_malloc
from rlreplay.wire.codec import packb
from tests.live import running_server

TABLE = "bench"
ITEMS = 256
ITEM_BYTES = 4096


def values() -> list[dict[str, object]]:
    rng = np.random.default_rng(0)
    return [
        {"key": f"k{i}", "value": {"obs": rng.integers(0, 255, ITEM_BYTES, dtype=np.uint8)}}
        for i in range(ITEMS)
    ]


async def rate(seconds: float, step: Callable[[], Awaitable[int]], callers: int = 1) -> float:
    """Items per second of ``callers`` tasks each running ``step`` until the time is up."""
    stop = time.perf_counter() + seconds
    counts = [0] * callers

    async def caller(i: int) -> None:
        while time.perf_counter() < stop:
            counts[i] += await step()

    start = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    return sum(counts) / (time.perf_counter() - start)


async def engine_rate(seconds: float, batch_size: int, callers: int) -> float:
    from rlreplay.app.engine.engine import Engine
    from rlreplay.app.settings import Settings
    from rlreplay.app.tables.config import SamplerSpec, TableConfig
    from rlreplay.app.tables.items import NewItem

    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(Settings(data_dir=Path(tmp)))
        await engine.start()
        try:
            await engine.create_table(TABLE, TableConfig(sampler=SamplerSpec(type="uniform")))
            new = [NewItem(key=str(v["key"]), value=packb(v["value"])) for v in values()]
            await engine.push(TABLE, new, wait=True)

            async def step() -> int:
                return len(await engine.sample(TABLE, batch_size))

            return await rate(seconds, step, callers)
        finally:
            await engine.stop()


async def http_rates(url: str, seconds: float, batch_size: int) -> list[tuple[str, float]]:
    results: list[tuple[str, float]] = []
    async with ReplayClient(url) as rb:
        await rb.create_table(TABLE, sampler={"type": "uniform"})
        await rb.push(TABLE, values(), wait=True)

        async def one() -> int:
            return len(await rb.sample(TABLE, batch_size))

        await rate(0.5, one)  # warm up
        results.append(("sequential sample()", await rate(seconds, one)))
        for prefetch in (1, 2, 4, 8, 16):
            count = 0
            start = time.perf_counter()
            async with aclosing(rb.stream(TABLE, batch_size=batch_size, prefetch=prefetch)) as s:
                async for batch in s:
                    count += len(batch)
                    if time.perf_counter() - start > seconds:
                        break
            results.append((f"stream(prefetch={prefetch})", count / (time.perf_counter() - start)))

    for callers in (1, 4, 16, 64):
        async with ReplayClient(url, max_connections=min(callers, 16)) as rb:

            async def step(rb: ReplayClient = rb) -> int:
                return len(await rb.sample(TABLE, batch_size))

            await rate(0.3, step, callers)
            label = f"{callers} concurrent callers, max_connections={min(callers, 16)}"
            results.append((label, await rate(seconds, step, callers)))
    async with ReplayClient(url, max_connections=64) as rb:

        async def step64() -> int:
            return len(await rb.sample(TABLE, batch_size))

        await rate(0.3, step64, 64)
        results.append(
            ("64 concurrent callers, max_connections=64", await rate(seconds, step64, 64))
        )
    return results


async def stub_rates(seconds: float, batch_size: int) -> list[tuple[str, float]]:
    """The client's own ceiling: a raw asyncio server answering a canned msgpack batch."""
    item = {"priority": 1.0, "probability": 0.1, "weight": 1.0, "times_sampled": 1}
    batch = [{**item, **value} for value in values()[:batch_size]]
    body = packb({"items": batch})
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/msgpack\r\n"
    canned = head + b"Content-Length: %d\r\n\r\n" % len(body) + body

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request_head = await reader.readuntil(b"\r\n\r\n")
                for line in request_head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        await reader.readexactly(int(line.split(b":")[1]))
                writer.write(canned)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    results = []
    async with ReplayClient(url) as rb:

        async def one() -> int:
            return len(await rb.sample(TABLE, batch_size))

        await rate(0.3, one)
        results.append(("stub server: sequential sample()", await rate(seconds, one)))
        count = 0
        start = time.perf_counter()
        async with aclosing(rb.stream(TABLE, batch_size=batch_size, prefetch=4)) as s:
            async for got in s:
                count += len(got)
                if time.perf_counter() - start > seconds:
                    break
        results.append(("stub server: stream(prefetch=4)", count / (time.perf_counter() - start)))
    for callers, connections in [(16, 16), (64, 16), (256, 16), (64, 64), (256, 256)]:
        async with ReplayClient(url, max_connections=connections) as rb:

            async def step(rb: ReplayClient = rb) -> int:
                return len(await rb.sample(TABLE, batch_size))

            await rate(0.3, step, callers)
            label = f"stub server: {callers} callers, max_connections={connections}"
            results.append((label, await rate(seconds, step, callers)))
    await asyncio.sleep(0.1)  # let the handlers see the client's connections close
    server.close()
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    tune_malloc()  # as a trainer taking large batches would
    print(f"{ITEMS} items x {ITEM_BYTES} B, batch_size={args.batch_size}, {args.seconds}s per row")
    rows: list[tuple[str, float]] = []
    for callers in (1, 4):
        label = f"engine in-process, {callers} caller(s), no HTTP"
        rows.append((label, await engine_rate(args.seconds, args.batch_size, callers)))
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp)) as server:
        rows += await http_rates(server.url, args.seconds, args.batch_size)
    rows += await stub_rates(args.seconds, args.batch_size)
    width = max(len(label) for label, _ in rows)
    for label, items_per_s in rows:
        mib = items_per_s * ITEM_BYTES / 2**20
        print(f"{label:<{width}}  {items_per_s:>10,.0f} items/s  {mib:>8,.1f} MiB/s")
    try:
        import sniffio  # noqa: F401

        print("sniffio is installed")
    except ImportError:
        print("sniffio is NOT installed: httpcore retries importing it on every lock it makes")


if __name__ == "__main__":
    asyncio.run(main())
