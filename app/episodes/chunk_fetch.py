"""Reading evicted chunks back from RocksDB off the event loop, before a read needs them.

A read route (``GET .../episodes/{episode}``) can wait: it plans the chunks its range
touches that are in RocksDB only and not in the table's
:class:`~rlreplay.app.episodes.chunk_cache.ChunkCache` (:func:`fetch_plan`), reads and
decompresses them in a blocking-I/O thread (:func:`load_chunks`), and puts them in the
cache back on the loop (:func:`keep_chunks`); the read that follows is handed them.
Chunks are keyed by their episode's storage, so a plan that an episode's deletion
overtook only caches arrays no read asks for, which age out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlreplay.app.episodes.episode_table import EpisodeTable
from rlreplay.app.episodes.fields import FieldSpec

__all__ = ["ChunkFetch", "fetch_plan", "keep_chunks", "load_chunks", "read_back"]

#: A chunk in the cache's terms: (storage id, field, chunk number).
ChunkKey = tuple[int, str, int]

#: Runs a blocking call in an I/O thread (``BlockingIO.run``).
RunBlocking = Callable[..., Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class ChunkFetch:
    """One chunk to read back: its cache key, RocksDB key, field and steps."""

    cache_key: ChunkKey
    store_key: bytes
    spec: FieldSpec
    steps: int


def fetch_plan(
    e: EpisodeTable,
    name: str,
    start: int,
    stop: int,
    fields: Sequence[str] | None = None,
    have: dict[ChunkKey, np.ndarray] | None = None,
) -> list[ChunkFetch]:
    """The chunks steps ``[start, stop)`` of episode ``name`` touch that are in RocksDB
    only, and neither cached nor in ``have`` (empty when the episode is missing).

    Such chunks found in the cache are added to ``have``, so that the read holds them even
    if caching others pushes them out."""
    ep = e.episode(name)
    specs = e.specs or {}
    if ep is None or not ep.steps.evicted_chunks:
        return []
    plan = []
    for f in specs if fields is None else fields:
        for c in ep.steps.evicted_in(f, start, min(stop, ep.length)):
            key = ep.steps.cache_key(f, c)
            if have is not None and key in have:
                continue
            array = e.cache.get(key)
            if array is not None:
                if have is not None:
                    have[key] = array
            else:
                plan.append(
                    ChunkFetch(key, ep.steps.chunk_key(f, c), specs[f], ep.steps.chunk_steps(c))
                )
    return plan


def load_chunks(e: EpisodeTable, plan: Sequence[ChunkFetch]) -> list[np.ndarray]:
    """The arrays of the planned chunks, read from RocksDB and decompressed (blocking: run
    it in an I/O thread)."""
    raws = e.residency.fetch([p.store_key for p in plan])
    return [e.codec.open(raw, p.spec, p.steps) for p, raw in zip(plan, raws, strict=True)]


def keep_chunks(
    e: EpisodeTable, plan: Sequence[ChunkFetch], arrays: Sequence[np.ndarray]
) -> dict[ChunkKey, np.ndarray]:
    """Put the loaded chunks in the table's cache (on the loop); returns them by cache key,
    for the read that follows (:meth:`EpisodeTable.read`'s ``fetched``: a chunk larger
    than the cache is not kept there)."""
    fetched = {}
    for p, array in zip(plan, arrays, strict=True):
        e.cache.put(p.cache_key, array)
        fetched[p.cache_key] = array
    return fetched


async def read_back(
    e: EpisodeTable,
    ranges: Callable[[], Iterable[tuple[str, int, int]]],
    fields: Sequence[str] | None,
    run: RunBlocking,
) -> dict[ChunkKey, np.ndarray] | None:
    """The chunks in RocksDB only that ``ranges`` (episode name, start, stop) touch, read
    back off the loop: a read's ``fetched`` (None when there are none).

    Memory freed or filled during a read-back may evict more chunks of the same ranges, so
    it plans again until nothing is left; each round only adds chunks, so it ends."""
    have: dict[ChunkKey, np.ndarray] = {}
    while True:
        plan = {
            p.cache_key: p
            for name, lo, hi in ranges()
            for p in fetch_plan(e, name, lo, hi, fields, have)
        }
        if not plan:
            return have or None
        chunks = list(plan.values())
        have.update(keep_chunks(e, chunks, await run(load_chunks, e, chunks)))
