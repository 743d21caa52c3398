"""One episode's steps, column by column, in chunks.

Steps ``[c·K, (c+1)·K)`` of a field form chunk ``c`` (``K``: the table's chunk length): each
field's values for those steps lie contiguous. Full chunks are sealed, compressed with zstd
when the table says so (an uncompressed sealed chunk is the array itself); the open tail, a
buffer of ``K`` steps, stays uncompressed until it fills or the episode ends, when it is
sealed as it is. A read of steps ``[a, b)`` is a few slices and one concatenate, and
decompresses only the chunks it touches (through the table's :class:`ChunkCache`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
import zstandard

from rlreplay.app.episodes.chunk_cache import ChunkCache
from rlreplay.app.episodes.fields import FieldSpec

__all__ = ["ChunkCodec", "EpisodeSteps"]

#: A sealed chunk: compressed bytes, or the chunk's array itself when uncompressed.
Sealed = bytes | np.ndarray

_storage_ids = itertools.count(1)


class ChunkCodec:
    """How sealed chunks are stored: ``"zstd"`` (level 3) or ``"none"``."""

    def __init__(self, compression: str) -> None:
        if compression not in ("none", "zstd"):
            raise ValueError(f"compression {compression!r} must be 'none' or 'zstd'")
        self.compression = compression
        self._compressor = zstandard.ZstdCompressor(level=3) if compression == "zstd" else None
        self._decompressor = zstandard.ZstdDecompressor()

    @property
    def compresses(self) -> bool:
        return self._compressor is not None

    def seal(self, array: np.ndarray) -> Sealed:
        """The stored form of a full (or last) chunk's ``array``."""
        if self._compressor is None:
            array.flags.writeable = False
            return array
        return self._compressor.compress(array.data)

    def open(self, sealed: Sealed, spec: FieldSpec, steps: int) -> np.ndarray:
        """The array of a sealed chunk of ``steps`` steps of ``spec``."""
        if isinstance(sealed, np.ndarray):
            return sealed
        raw = self._decompressor.decompress(sealed, max_output_size=steps * spec.step_bytes)
        array = np.frombuffer(raw, dtype=spec.np_dtype).reshape((steps, *spec.shape))
        return array

    def from_stored(self, raw: bytes, spec: FieldSpec, steps: int) -> Sealed:
        """A sealed chunk read back from storage (:meth:`stored` gave ``raw``)."""
        if self._compressor is not None:
            return raw
        array = np.frombuffer(raw, dtype=spec.np_dtype).reshape((steps, *spec.shape))
        return array

    @staticmethod
    def stored(sealed: Sealed) -> bytes | memoryview:
        """The bytes a checkpoint writes for a sealed chunk."""
        if isinstance(sealed, np.ndarray):
            return np.ascontiguousarray(sealed).data.cast("B")
        return sealed


def sealed_bytes(sealed: Sealed) -> int:
    return sealed.nbytes if isinstance(sealed, np.ndarray) else len(sealed)


class EpisodeSteps:
    """The steps of one episode (see the module docstring). Only its
    :class:`~rlreplay.app.episodes.episode_table.EpisodeTable` changes it."""

    __slots__ = ("_chunk", "_codec", "_sealed", "_specs", "_tail", "id", "length", "stored_bytes")

    def __init__(self, specs: Mapping[str, FieldSpec], chunk_steps: int, codec: ChunkCodec) -> None:
        self.id = next(_storage_ids)  # names its chunks in the cache; never reused
        self._specs = specs
        self._chunk = chunk_steps
        self._codec = codec
        self._sealed: dict[str, list[Sealed]] = {name: [] for name in specs}
        self._tail: dict[str, np.ndarray] | None = None
        self.length = 0
        self.stored_bytes = 0

    @property
    def sealed_chunks(self) -> int:
        """Chunks sealed so far (the same for every field)."""
        return len(next(iter(self._sealed.values()), []))

    def _tail_steps(self) -> int:
        return self.length - self.sealed_chunks * self._chunk

    def append(self, steps: Mapping[str, np.ndarray], k: int) -> None:
        """Append ``k`` steps (checked against the fields by the caller)."""
        done = 0
        while done < k:
            if self._tail is None:
                self._tail = {
                    name: np.empty((self._chunk, *spec.shape), dtype=spec.np_dtype)
                    for name, spec in self._specs.items()
                }
            at = self._tail_steps()
            n = min(k - done, self._chunk - at)
            for name, buffer in self._tail.items():
                buffer[at : at + n] = steps[name][done : done + n]
            self.length += n
            self.stored_bytes += n * sum(s.step_bytes for s in self._specs.values())
            done += n
            if at + n == self._chunk:
                self.seal()

    def seal(self) -> None:
        """Seal the open tail (full, or the last steps of an ended episode)."""
        tail, n = self._tail, self._tail_steps()
        self._tail = None
        if tail is None or n == 0:
            return
        for name, buffer in tail.items():
            spec = self._specs[name]
            sealed = self._codec.seal(buffer[:n] if n < self._chunk else buffer)
            self._sealed[name].append(sealed)
            self.stored_bytes += sealed_bytes(sealed) - n * spec.step_bytes

    def read(self, name: str, start: int, stop: int, cache: ChunkCache) -> np.ndarray:
        """Steps ``[start, stop)`` of field ``name`` (within ``[0, length)``); the array may
        be a read-only view of what is stored."""
        spec = self._specs[name]
        if stop <= start:
            return np.empty((0, *spec.shape), dtype=spec.np_dtype)
        K = self._chunk
        pieces: list[np.ndarray] = []
        sealed = self._sealed[name]
        for c in range(start // K, (stop - 1) // K + 1):
            lo, hi = max(start, c * K) - c * K, min(stop, (c + 1) * K) - c * K
            if c < len(sealed):
                pieces.append(self._chunk_array(name, spec, c, sealed[c], cache)[lo:hi])
            else:
                assert self._tail is not None
                pieces.append(self._tail[name][lo:hi])
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def _chunk_array(
        self, name: str, spec: FieldSpec, c: int, sealed: Sealed, cache: ChunkCache
    ) -> np.ndarray:
        if isinstance(sealed, np.ndarray):
            return sealed
        key = (self.id, name, c)
        array = cache.get(key)
        if array is None:
            steps = min(self._chunk, self.length - c * self._chunk)
            array = self._codec.open(sealed, spec, steps)
            cache.put(key, array)
        return array

    # -- persistence ------------------------------------------------------------------------

    def chunks_of(self, name: str) -> list[Sealed]:
        """The sealed chunks of field ``name``, in order (read-only)."""
        return self._sealed[name]

    def tail_state(self) -> dict[str, bytes]:
        """The open tail's steps, field by field, as bytes."""
        n = self._tail_steps()
        if self._tail is None or n == 0:
            return {}
        return {name: buffer[:n].tobytes() for name, buffer in self._tail.items()}

    def load(
        self, chunks: Mapping[str, list[bytes]], tail: Mapping[str, bytes], length: int
    ) -> None:
        """Take back the chunks and tail of :meth:`chunks_of` and :meth:`tail_state`."""
        K = self._chunk
        n_sealed = len(next(iter(chunks.values()), []))
        for name, spec in self._specs.items():
            got = chunks.get(name, [])
            sealed = []
            for c, raw in enumerate(got):
                steps = min(K, length - c * K)
                sealed.append(self._codec.from_stored(raw, spec, steps))
                self.stored_bytes += len(raw)
            self._sealed[name] = sealed
        self.length = n_sealed * K if n_sealed * K <= length else length
        rest = length - self.length
        if rest > 0 and tail:
            arrays = {
                name: np.frombuffer(tail[name], dtype=spec.np_dtype).reshape((rest, *spec.shape))
                for name, spec in self._specs.items()
            }
            self.append(arrays, rest)
