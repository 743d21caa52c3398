"""The one adapter that runs blocking work (RocksDB, files, fsync) off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class BlockingIO:
    """A small thread pool owned by the engine; ``await io.run(fn, *args)`` runs ``fn`` there.

    Every RocksDB call that can take more than a few microseconds and every file or
    fsync goes through here, so no route ever blocks the loop on storage.
    """

    def __init__(self, *, threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rlreplay-io")

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` in the pool and await its result."""
        loop = asyncio.get_running_loop()
        if kwargs:
            return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))
        return await loop.run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        """Wait for running calls and stop the threads."""
        self._pool.shutdown(wait=True)
