"""Reads of an episode table's steps for one window build, decompression left to the copy.

A window build reads each window chunk by chunk (:class:`~rlreplay.app.episodes.windows.
WindowBuild`) on the event loop, then copies the values into the batch, possibly in an I/O
thread. :class:`ChunkReads` answers those reads without decompressing anything on the loop:
a chunk the table's :class:`~rlreplay.app.episodes.chunk_cache.ChunkCache` holds, or one
stored uncompressed, or an open tail, is handed over as a view where it lies; a compressed
chunk the cache lacks is handed over as its sealed bytes, decompressed the first time the
copy looks at it (once per build, however many windows share it), with a decompressor of
its own (a zstd decompressor serves one thread at a time). :meth:`ChunkReads.keep` then
puts what was decompressed into the cache, back on the loop.

Sealed chunks never change, so their bytes may be read in any thread. A chunk in RocksDB
only is read through the table, from ``fetched`` (chunks read back beforehand, off the loop:
:mod:`~rlreplay.app.episodes.chunk_fetch`) or else from the store.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import zstandard

from rlreplay.app.episodes.episode import Episode
from rlreplay.app.episodes.episode_table import EpisodeTable
from rlreplay.app.episodes.fields import FieldSpec

__all__ = ["ChunkReads"]

#: A chunk in the cache's terms: (storage id, field, chunk number).
ChunkKey = tuple[int, str, int]


class ChunkReads:
    """One build's reads of ``table`` (see the module), of the episodes the draw found
    (held here, so that a read after an await still finds an episode deleted meanwhile: its
    steps were drawn, and stay readable while referenced).

    Args:
        table: The episode table.
        episodes: Episode index (as the draw saw it) -> the episode.
        fetched: Evicted chunks read back already, by cache key.
    """

    def __init__(
        self,
        table: EpisodeTable,
        episodes: Mapping[int, Episode],
        fetched: Mapping[ChunkKey, npt.NDArray[Any]] | None = None,
    ) -> None:
        self._table = table
        self._episodes = episodes
        self._fetched = fetched
        self._opened: dict[ChunkKey, npt.NDArray[Any]] = {}
        #: Reads handed over with chunks left to decompress (in the copy).
        self.deferred = 0
        self._decompressor: zstandard.ZstdDecompressor | None = None
        self._K = table.chunk_steps
        self._cached = table.cache.get

    def read(
        self, index: int, start: int, stop: int, fields: Sequence[str]
    ) -> Mapping[str, npt.NDArray[Any]]:
        """Steps ``[start, stop)`` (within one chunk) of episode ``index``: a
        :data:`~rlreplay.app.episodes.windows.ReadSteps`."""
        ep = self._episodes[index]
        steps = ep.steps
        K = self._K
        c = start // K
        if c >= steps.sealed_chunks:  # the open tail
            return self._table_read(ep, start, stop, fields)
        lo, hi = start - c * K, stop - c * K
        cached, fetched, sid = self._cached, self._fetched, steps.id
        ready: dict[str, npt.NDArray[Any]] = {}
        sealed: dict[str, tuple[ChunkKey, bytes, FieldSpec]] = {}
        others: list[str] = []
        array: npt.NDArray[Any] | None
        for f in fields:
            held = steps.chunks_of(f)[c]
            if isinstance(held, np.ndarray):  # stored uncompressed, or not compressed yet
                array = held
            else:
                key = (sid, f, c)
                array = cached(key)
                if array is None and fetched is not None:
                    array = fetched.get(key)
                if array is None:
                    if held is not None:
                        sealed[f] = (key, held, (self._table.specs or {})[f])
                    else:  # in RocksDB only and not read back: the table's read
                        others.append(f)
                    continue
            # a whole chunk (what a gather reads): no view to make
            ready[f] = array if lo == 0 and hi == len(array) else array[lo:hi]
        steps.touch(c)  # in use: evicted last
        if others:
            ready.update(self._table_read(ep, start, stop, others))
        if not sealed:
            return ready
        self.deferred += 1
        return _Piece(self, ready, sealed, steps.chunk_steps(c), lo, hi)

    def _table_read(
        self, ep: Episode, start: int, stop: int, fields: Sequence[str]
    ) -> dict[str, npt.NDArray[Any]]:
        cache, fetched = self._table.cache, self._fetched
        return {f: ep.steps.read(f, start, stop, cache, fetched) for f in fields}

    def opened(self, key: ChunkKey, raw: bytes, spec: FieldSpec, steps: int) -> npt.NDArray[Any]:
        """The chunk ``key`` decompressed (once per build)."""
        array = self._opened.get(key)
        if array is None:
            if self._decompressor is None:
                self._decompressor = zstandard.ZstdDecompressor()
            data = self._decompressor.decompress(raw, max_output_size=steps * spec.step_bytes)
            array = np.frombuffer(data, dtype=spec.np_dtype).reshape((steps, *spec.shape))
            self._opened[key] = array
        return array

    def keep(self) -> None:
        """Put the chunks decompressed into the table's cache (on the loop, after the copy)."""
        for key, array in self._opened.items():
            self._table.cache.put(key, array)
        self._opened.clear()


class _Piece(Mapping[str, npt.NDArray[Any]]):
    """The steps of one read: field -> its values (steps ``[lo, hi)`` of a chunk of
    ``steps``), decompressed when first looked at."""

    __slots__ = ("_hi", "_lo", "_reads", "_ready", "_sealed", "_steps")

    def __init__(
        self,
        reads: ChunkReads,
        ready: dict[str, npt.NDArray[Any]],
        sealed: dict[str, tuple[ChunkKey, bytes, FieldSpec]],
        steps: int,
        lo: int,
        hi: int,
    ) -> None:
        self._reads, self._ready, self._sealed = reads, ready, sealed
        self._steps, self._lo, self._hi = steps, lo, hi

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        array = self._ready.get(name)
        if array is None:
            key, raw, spec = self._sealed[name]
            array = self._reads.opened(key, raw, spec, self._steps)[self._lo : self._hi]
            self._ready[name] = array
        return array

    def __iter__(self) -> Iterator[str]:
        yield from self._ready
        yield from (f for f in self._sealed if f not in self._ready)

    def __len__(self) -> int:
        return len(self._ready.keys() | self._sealed.keys())
