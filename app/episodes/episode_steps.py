"""One episode's steps, column by column, in chunks.

Steps ``[c·K, (c+1)·K)`` of a field form chunk ``c`` (``K``: the table's chunk length): each
field's values for those steps lie contiguous. The open tail, a buffer of ``K`` steps, takes
appends until it fills or the episode ends; it is then sealed: kept as it is, and, when the
table compresses, handed to the writer to compress with zstd off the event loop
(:meth:`EpisodeSteps.to_compress`, :meth:`EpisodeSteps.compressed`). A read of steps
``[a, b)`` is a few slices and one concatenate, and decompresses only the chunks it touches
(through the table's :class:`ChunkCache`).

Held chunks and the open tail are entries of the cache ledger (through the table's
:class:`~rlreplay.app.episodes.chunk_residency.ChunkResidency`); a sealed chunk the writer
moved to RocksDB (:meth:`EpisodeSteps.evicted`) is read back from there.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence

import numpy as np
import zstandard

from rlreplay.app.episodes.chunk_cache import ChunkCache
from rlreplay.app.episodes.chunk_residency import TAIL, ChunkResidency
from rlreplay.app.episodes.fields import FieldSpec

__all__ = ["ChunkCodec", "EpisodeSteps"]

#: A sealed chunk: compressed bytes, or the chunk's array itself when uncompressed.
Sealed = bytes | np.ndarray

_storage_ids = itertools.count(1)


class ChunkCodec:
    """How sealed chunks are stored: ``"zstd"`` (level 3) or ``"none"``. Safe to use from
    several threads (each has its own zstd contexts)."""

    def __init__(self, compression: str) -> None:
        if compression not in ("none", "zstd"):
            raise ValueError(f"compression {compression!r} must be 'none' or 'zstd'")
        self.compression = compression
        self._local = threading.local()

    @property
    def compresses(self) -> bool:
        return self.compression == "zstd"

    def _zstd(self) -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
        pair = getattr(self._local, "pair", None)
        if pair is None:
            pair = self._local.pair = (
                zstandard.ZstdCompressor(level=3),
                zstandard.ZstdDecompressor(),
            )
        return pair

    def compress(self, arrays: Sequence[np.ndarray]) -> list[bytes]:
        """``arrays`` compressed (the writer runs this in a blocking-I/O thread)."""
        compressor = self._zstd()[0]
        return [compressor.compress(np.ascontiguousarray(a).data) for a in arrays]

    def open(self, data: bytes, spec: FieldSpec, steps: int) -> np.ndarray:
        """The array of a chunk of ``steps`` steps of ``spec`` stored as ``data``."""
        if self.compresses:
            data = self._zstd()[1].decompress(data, max_output_size=steps * spec.step_bytes)
        return np.frombuffer(data, dtype=spec.np_dtype).reshape((steps, *spec.shape))

    def stored(self, sealed: Sealed) -> bytes | memoryview:
        """The bytes RocksDB or a checkpoint keeps for a held chunk."""
        if isinstance(sealed, np.ndarray):
            if self.compresses:  # sealed, not compressed yet (no writer took it)
                return self.compress([sealed])[0]
            return np.ascontiguousarray(sealed).data.cast("B")
        return sealed


def sealed_bytes(sealed: Sealed) -> int:
    return sealed.nbytes if isinstance(sealed, np.ndarray) else len(sealed)


class EpisodeSteps:
    """The steps of one episode (see the module docstring). Only its
    :class:`~rlreplay.app.episodes.episode_table.EpisodeTable` changes it; the writer moves
    its chunks in and out of memory."""

    __slots__ = (
        "_chunk",
        "_codec",
        "_held",
        "_residency",
        "_sealed",
        "_specs",
        "_stored",
        "_tail",
        "_tail_slot",
        "created",
        "evicted_chunks",
        "id",
        "length",
        "raw",
        "stored_bytes",
    )

    def __init__(
        self,
        specs: Mapping[str, FieldSpec],
        chunk_steps: int,
        codec: ChunkCodec,
        residency: ChunkResidency,
        created: int,
    ) -> None:
        self.id = next(_storage_ids)  # names its chunks in the cache; never reused
        self.created = created  # names its chunks in RocksDB
        self._specs = specs
        self._chunk = chunk_steps
        self._codec = codec
        self._residency = residency
        #: Field → chunk → held chunk (None: evicted to RocksDB).
        self._sealed: dict[str, list[Sealed | None]] = {name: [] for name in specs}
        self._held: list[int] = []  # chunk → its residency slot (-1: not held)
        self._stored: list[bool] = []  # chunk → RocksDB holds it
        self._tail: dict[str, np.ndarray] | None = None
        self._tail_slot = -1
        self.length = 0
        self.stored_bytes = 0
        #: Sealed chunks in RocksDB only (a read of one reads it back).
        self.evicted_chunks = 0
        #: Chunks sealed and not compressed yet (the table compresses).
        self.raw: list[int] = []

    @property
    def sealed_chunks(self) -> int:
        """Chunks sealed so far (the same for every field)."""
        return len(self._held)

    def _tail_steps(self) -> int:
        return self.length - self.sealed_chunks * self._chunk

    def _chunk_len(self, c: int) -> int:
        return min(self._chunk, self.length - c * self._chunk)

    def append(self, steps: Mapping[str, np.ndarray], k: int) -> None:
        """Append ``k`` steps (checked against the fields by the caller)."""
        done = 0
        step_bytes = sum(s.step_bytes for s in self._specs.values())
        while done < k:
            if self._tail is None:
                self._tail = {
                    name: np.empty((self._chunk, *spec.shape), dtype=spec.np_dtype)
                    for name, spec in self._specs.items()
                }
                self._tail_slot = self._residency.hold(self, TAIL, 0)
            at = self._tail_steps()
            n = min(k - done, self._chunk - at)
            for name, buffer in self._tail.items():
                buffer[at : at + n] = steps[name][done : done + n]
            # charged what it holds: the buffer's pages past its steps are not touched yet
            self._residency.recharge(self._tail_slot, (at + n) * step_bytes)
            self.length += n
            self.stored_bytes += n * step_bytes
            done += n
            if at + n == self._chunk:
                self.seal()

    def seal(self) -> None:
        """Seal the open tail (full, or the last steps of an ended episode)."""
        tail, n = self._tail, self._tail_steps()
        self._tail = None
        if self._tail_slot >= 0:
            self._residency.release(self._tail_slot)
            self._tail_slot = -1
        if tail is None or n == 0:
            return
        c, charge = self.sealed_chunks, 0
        for name, buffer in tail.items():
            array = buffer if n == self._chunk else buffer[:n].copy()
            array.flags.writeable = False
            self._sealed[name].append(array)
            charge += array.nbytes
        self._held.append(self._residency.hold(self, c, charge))
        self._stored.append(False)
        if self._codec.compresses:
            self.raw.append(c)

    # -- compression (the writer's) -----------------------------------------------------

    def to_compress(self) -> list[tuple[int, list[np.ndarray]]]:
        """The chunks sealed and not compressed yet, each field's array, in field order."""
        jobs = [(c, [self._sealed[f][c] for f in self._specs]) for c in self.raw]
        self.raw = []
        return [(c, [a for a in arrays if isinstance(a, np.ndarray)]) for c, arrays in jobs]

    def compressed(self, c: int, data: Sequence[bytes]) -> int:
        """Hold chunk ``c`` as ``data`` (its fields compressed, in field order) instead of
        its arrays; returns the change of :attr:`stored_bytes`."""
        delta = 0
        for name, blob in zip(self._specs, data, strict=True):
            old = self._sealed[name][c]
            if old is None:  # pragma: no cover - evicted before it was compressed
                return 0
            delta += len(blob) - sealed_bytes(old)
            self._sealed[name][c] = blob
        self.stored_bytes += delta
        if self._held[c] >= 0:
            self._residency.recharge(self._held[c], sum(len(b) for b in data))
        return delta

    # -- reads --------------------------------------------------------------------------

    def read(
        self,
        name: str,
        start: int,
        stop: int,
        cache: ChunkCache,
        fetched: Mapping[tuple[int, str, int], np.ndarray] | None = None,
    ) -> np.ndarray:
        """Steps ``[start, stop)`` of field ``name`` (within ``[0, length)``); the array may
        be a read-only view of what is stored. ``fetched``: chunks read back already, by
        their cache key."""
        spec = self._specs[name]
        if stop <= start:
            return np.empty((0, *spec.shape), dtype=spec.np_dtype)
        K = self._chunk
        pieces: list[np.ndarray] = []
        n_sealed = self.sealed_chunks
        for c in range(start // K, (stop - 1) // K + 1):
            lo, hi = max(start, c * K) - c * K, min(stop, (c + 1) * K) - c * K
            if c < n_sealed:
                pieces.append(self._chunk_array(name, spec, c, cache, fetched)[lo:hi])
            else:
                assert self._tail is not None
                pieces.append(self._tail[name][lo:hi])
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def _chunk_array(
        self,
        name: str,
        spec: FieldSpec,
        c: int,
        cache: ChunkCache,
        fetched: Mapping[tuple[int, str, int], np.ndarray] | None,
    ) -> np.ndarray:
        held = self._sealed[name][c]
        slot = self._held[c]
        if slot >= 0:
            self._residency.touch(slot)
        if isinstance(held, np.ndarray):
            return held
        key = (self.id, name, c)
        array = cache.get(key) if fetched is None else fetched.get(key, cache.get(key))
        if array is None:
            if held is None:  # evicted: read back from RocksDB, on this thread (see fetch)
                held = self._residency.fetch([self.chunk_key(name, c)])[0]
            array = self._codec.open(held, spec, self._chunk_len(c))
            cache.put(key, array)
        return array

    def touch(self, c: int) -> None:
        """A read used sealed chunk ``c`` without :meth:`read` (its CLOCK bit in the cache
        ledger, so that chunks in use are evicted last)."""
        slot = self._held[c]
        if slot >= 0:
            self._residency.touch(slot)

    def chunk_key(self, name: str, c: int) -> bytes:
        """The RocksDB key of chunk ``c`` of field ``name``."""
        return self._residency.key(self.created, name, c)

    def evicted_in(self, name: str, start: int, stop: int) -> list[int]:
        """The chunks of field ``name`` that steps ``[start, stop)`` touch and that are in
        RocksDB only."""
        K, sealed = self._chunk, self._sealed[name]
        last = min((stop - 1) // K, len(sealed) - 1)
        return [c for c in range(start // K, last + 1) if sealed[c] is None] if stop > start else []

    def cache_key(self, name: str, c: int) -> tuple[int, str, int]:
        """The :class:`ChunkCache` key of chunk ``c`` of field ``name``."""
        return (self.id, name, c)

    def chunk_steps(self, c: int) -> int:
        """Steps in chunk ``c``."""
        return self._chunk_len(c)

    # -- memory and RocksDB (the writer's) ----------------------------------------------

    def store_puts(self, c: int) -> list[tuple[bytes, bytes]]:
        """What RocksDB needs to hold chunk ``c`` (nothing when it holds it already)."""
        if self._stored[c]:
            return []
        puts = []
        for name in self._specs:
            held = self._sealed[name][c]
            assert held is not None, "a chunk not stored and not held"
            puts.append((self.chunk_key(name, c), bytes(self._codec.stored(held))))
        return puts

    def evicted(self, c: int) -> int:
        """Chunk ``c`` is in RocksDB now (its puts written) and leaves memory; the bytes
        it held. The ledger gave up its entry already."""
        self._stored[c] = True
        slot = self._held[c]
        if slot < 0:
            return 0
        freed = 0
        for name in self._specs:
            held = self._sealed[name][c]
            freed += 0 if held is None else sealed_bytes(held)
            self._sealed[name][c] = None
        self._held[c] = -1
        self.evicted_chunks += 1
        self._residency.release(slot, forgotten=True)
        return freed

    def unstored(self) -> list[int]:
        """The sealed chunks RocksDB does not hold yet."""
        return [c for c, stored in enumerate(self._stored) if not stored]

    def mark_stored(self, chunks: Sequence[int]) -> None:
        """RocksDB holds ``chunks`` now (a checkpoint wrote them)."""
        for c in chunks:
            self._stored[c] = True

    def release(self) -> None:
        """The episode is gone: its chunks and tail leave memory."""
        for c, slot in enumerate(self._held):
            if slot >= 0:
                self._residency.release(slot)
                self._held[c] = -1
        if self._tail_slot >= 0:
            self._residency.release(self._tail_slot)
            self._tail_slot = -1

    @property
    def in_store(self) -> bool:
        """Whether RocksDB holds any of its chunks."""
        return any(self._stored)

    # -- persistence ------------------------------------------------------------------------

    def chunks_of(self, name: str) -> list[Sealed | None]:
        """The sealed chunks of field ``name``, in order (read-only; None: in RocksDB)."""
        return self._sealed[name]

    def tail_state(self) -> dict[str, bytes]:
        """The open tail's steps, field by field, as bytes."""
        n = self._tail_steps()
        if self._tail is None or n == 0:
            return {}
        return {name: buffer[:n].tobytes() for name, buffer in self._tail.items()}

    def load(
        self,
        chunks: Mapping[str, Sequence[bytes | int]],
        tail: Mapping[str, bytes],
        length: int,
    ) -> None:
        """Take back the chunks and tail of :meth:`chunks_of` and :meth:`tail_state`: each
        chunk's stored bytes, to hold, or its size in bytes when it stays in RocksDB."""
        K = self._chunk
        n_sealed = len(next(iter(chunks.values()), []))
        self.length = n_sealed * K if n_sealed * K <= length else length
        held_charge = [0] * n_sealed
        for name, spec in self._specs.items():
            sealed: list[Sealed | None] = []
            for c, got in enumerate(chunks.get(name, [])):
                if isinstance(got, int):
                    sealed.append(None)
                    self.stored_bytes += got
                    continue
                steps = min(K, length - c * K)
                data = self._codec.open(got, spec, steps) if not self._codec.compresses else got
                sealed.append(data)
                self.stored_bytes += len(got)
                held_charge[c] += len(got)
            self._sealed[name] = sealed
        for c in range(n_sealed):
            on_disk = self._sealed[next(iter(self._specs))][c] is None if self._specs else True
            self._stored.append(on_disk)
            self.evicted_chunks += on_disk
            self._held.append(-1 if on_disk else self._residency.hold(self, c, held_charge[c]))
        rest = length - self.length
        if rest > 0 and tail:
            arrays = {
                name: np.frombuffer(tail[name], dtype=spec.np_dtype).reshape((rest, *spec.shape))
                for name, spec in self._specs.items()
            }
            self.append(arrays, rest)
