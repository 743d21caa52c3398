"""The memory-mode checkpoint file: the tables' items, written atomically.

Memory mode has no RocksDB: a checkpoint writes the tables to ``memory.ckpt`` (a temporary
file, fsynced, renamed), so the log stays bounded. The items whose value was logged after
the position the file covers are left out: the log from there, which a restart replays,
holds them.

The file (format 2) is :data:`MAGIC`, then chunks ``<kind:u8><length:u32><xxh3_64:u64>
<payload>``: the header (``H``: a msgpack map of the tables' state and the log position
covered), rows (``R``: msgpack rows back to back, about 1 MiB a chunk; an episode table's
rows have no key, and the blobs of :func:`~rlreplay.app.episodes.persistence.episode_blobs`
as values) and an end marker
(``E``: how many chunks and rows came before it, and their bytes). So a file cut short, a
flipped byte, an empty file or a header cut short are each found, and named with their
bytes, before anything is loaded. A file of format 1 (an older server's: a msgpack header
and rows, no checksum) is still read; a cut inside it is found, a flipped byte is not.
"""

from __future__ import annotations

import asyncio
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import msgpack
import numpy as np
from xxhash import xxh3_64_intdigest

from rlreplay.app.episodes.persistence import episode_blobs
from rlreplay.app.log.framing import LogRecoveryError
from rlreplay.app.tables.rollouts import NO_VERSION
from rlreplay.app.writer.request_ids import WindowSnapshot

if TYPE_CHECKING:
    from rlreplay.app.log.data_loss import DataLoss
    from rlreplay.app.tables.table import Table

MEMORY_CHECKPOINT = "memory.ckpt"
MAGIC = b"RLRCKPT\x02"
CHUNK = struct.Struct("<BIQ")  # kind, payload length, xxh3_64 of the payload
HEADER, ROWS, END = b"H"[0], b"R"[0], b"E"[0]
_SNAPSHOT_BUFFER = 16 << 20  # the file buffer
_CHUNK_BYTES = 1 << 20  # rows are checksummed in chunks of about this many bytes
_META_SLICE = 4096  # rollout metadata captured between turns of the event loop

Rows = list[tuple[Any, ...]]


@dataclass(slots=True)
class TableRows:
    """One table's items as a checkpoint captured them: copies of its columns (the values
    and keys are referenced: they are immutable), so the file is written in an I/O thread
    while the writer goes on changing the table."""

    tid: int
    #: The slots holding an item whose value was logged up to the checkpoint's position.
    slots: np.ndarray
    keys: list[str | None]
    values: list[bytes | None]
    priority: np.ndarray
    inserted_at: np.ndarray
    times_sampled: np.ndarray
    order: np.ndarray
    #: slot -> a rollout's metadata, for the slots that have some.
    metas: dict[int, list[Any]]
    #: An episode table's state and episodes, packed when captured (they change after).
    episodes: list[bytes]


async def capture_rows(tables: list[Table], upto: int) -> list[TableRows]:
    """The items of ``tables`` whose value was logged up to ``upto``, as they are now (on
    the event loop, the writer waiting: list and array copies, about a millisecond per
    100,000 items; a rollout table's metadata in slices, the loop turning between them)."""
    captured = []
    for t in tables:
        n = len(t.keys)
        slots = np.flatnonzero(t.put_seq[:n] <= upto)
        rows = TableRows(
            tid=t.tid,
            slots=slots,
            keys=t.keys[:n],
            values=t.values[:n],
            priority=t.priority[:n].copy(),
            inserted_at=t.inserted_at[:n].copy(),
            times_sampled=t.times_sampled[:n].copy(),
            order=t.order[:n].copy(),
            metas={},
            episodes=list(episode_blobs(t.episodes)) if t.episodes is not None else [],
        )
        with_meta = _meta_slots(t, slots, n).tolist()
        meta_of = t.rollouts.meta_of
        for at in range(0, len(with_meta), _META_SLICE):
            for slot in with_meta[at : at + _META_SLICE]:
                if rows.keys[slot] is not None and (meta := meta_of(slot)) is not None:
                    rows.metas[slot] = meta
            await asyncio.sleep(0)  # only the writer changes these, and it is here
        captured.append(rows)
    return captured


def _meta_slots(t: Table, slots: np.ndarray, n: int) -> np.ndarray:
    """Those of ``slots`` whose item may have rollout metadata (what
    :meth:`~rlreplay.app.tables.rollouts.Rollouts.meta_of` reads is set): none in a table
    without rollouts, found with numpy."""
    r = t.rollouts
    has = t.policy_version[:n] != NO_VERSION
    has |= r.field_masks.low[:n] != 0
    has |= r.acked_masks.low[:n] != 0
    more = [*r.groups, *r.tag_index.of, *r.field_masks.high, *r.acked_masks.high]
    if more:
        has[[slot for slot in more if slot < n]] = True
    found: np.ndarray = slots[has[slots]]
    return found


def write_checkpoint_file(path: Path, header: dict[str, Any], tables: list[TableRows]) -> None:
    """Write the snapshot of the captured ``tables`` (in an I/O thread, the writer going
    on meanwhile).

    The rows go through a 16 MiB file buffer, and the numeric columns are read as lists
    once per table: this thread needs the GIL between system calls, and with an 8 KiB
    buffer (a write every two 4 KiB values) each wait for the busy event loop stretched a
    snapshot many times over (commit 99be753 has the figures).
    """
    tmp = path.with_suffix(".tmp")
    try:
        _write_rows(tmp, header, tables)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a half-written file would hold on to the space it took
        raise
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pack_header(packer: msgpack.Packer, header: dict[str, Any]) -> bytes:
    """The header's msgpack, a :class:`WindowSnapshot` in it packed in slices (the window
    of request ids can hold 100,000: one call into msgpack would hold the GIL for tens of
    milliseconds, and the event loop with it)."""
    parts = [packer.pack_map_header(len(header))]
    for key, value in header.items():
        parts.append(packer.pack(key))
        parts.append(value.packed() if isinstance(value, WindowSnapshot) else packer.pack(value))
    return b"".join(parts)


class _ChunkWriter:
    """Writes checksummed chunks to a file and counts them."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.chunks, self.rows, self.bytes = f, 0, 0, len(MAGIC)
        f.write(MAGIC)

    def chunk(self, kind: int, payload: bytes | bytearray) -> None:
        self.f.write(CHUNK.pack(kind, len(payload), xxh3_64_intdigest(payload)))
        self.f.write(payload)
        self.chunks += 1
        self.bytes += CHUNK.size + len(payload)


def _write_rows(tmp: Path, header: dict[str, Any], tables: list[TableRows]) -> None:
    packer = msgpack.Packer(use_bin_type=True)
    with open(tmp, "wb", buffering=_SNAPSHOT_BUFFER) as f:
        out = _ChunkWriter(f)
        out.chunk(HEADER, _pack_header(packer, header))
        rows = bytearray()
        for t in tables:
            priority = t.priority.tolist()
            inserted_at = t.inserted_at.tolist()
            times_sampled = t.times_sampled.tolist()
            order = t.order.tolist()
            keys, values, metas = t.keys, t.values, t.metas
            for slot in t.slots.tolist():
                key = keys[slot]
                if key is not None:
                    row: tuple[Any, ...] = (
                        t.tid,
                        key,
                        values[slot],
                        priority[slot],
                        inserted_at[slot],
                        times_sampled[slot],
                        order[slot],
                    )
                    meta = metas.get(slot) if metas else None
                    if meta is not None:  # a rollout's metadata, only where it has some
                        row = (*row, meta)
                    rows += packer.pack(row)
                    out.rows += 1
                    if len(rows) >= _CHUNK_BYTES:
                        out.chunk(ROWS, rows)
                        rows = bytearray()
            # an episode table's rows: key None, the value a blob of its state or an episode
            for blob in t.episodes:
                rows += packer.pack((t.tid, None, blob, 0.0, 0.0, 0, 0))
                out.rows += 1
                if len(rows) >= _CHUNK_BYTES:
                    out.chunk(ROWS, rows)
                    rows = bytearray()
        if rows:
            out.chunk(ROWS, rows)
        out.chunk(END, packer.pack([out.chunks, out.rows, out.bytes]))
        f.flush()
        os.fsync(f.fileno())


def read_checkpoint_file(
    path: Path, loss: DataLoss | None = None
) -> tuple[dict[str, Any] | None, Rows]:
    """The header and rows of a memory-mode checkpoint (blocking).

    A damaged file raises :class:`LogRecoveryError` naming it and the bytes, unless
    ``loss`` lets the start go on: then the header (None if it is lost) and the rows of the
    chunks before the damage come back.
    """
    size = path.stat().st_size
    reader: _ChunkReader | _LegacyReader | None = None
    with open(path, "rb") as f:
        magic = f.read(len(MAGIC))
        if magic == MAGIC:
            reader = _ChunkReader(f, path, size)
        elif magic[:1] and (0x80 <= magic[0] <= 0x8F or magic[0] in (0xDE, 0xDF)):
            f.seek(0)  # format 1: a msgpack map, then rows
            reader = _LegacyReader(f, path, size)
        what = "empty (0 bytes)" if size == 0 else "not a checkpoint (no header at byte 0)"
        problem = f"the checkpoint file {path} is {what}" if reader is None else reader.read()
        if problem is None and reader is not None:
            return reader.header, reader.rows
    assert problem is not None
    if loss is None:
        raise LogRecoveryError(problem, kind="checkpoint_damaged")
    loss.found("checkpoint_damaged", problem)
    return (None, []) if reader is None else (reader.header, reader.rows)


class _ChunkReader:
    """Reads a format-2 checkpoint, chunk by chunk, checking each."""

    def __init__(self, f: IO[bytes], path: Path, size: int) -> None:
        self.f, self.path, self.size = f, path, size
        self.header: dict[str, Any] | None = None
        self.rows: Rows = []

    def read(self) -> str | None:
        """Read the file; returns what is wrong with it (None: it is whole)."""
        chunks, pos = 0, len(MAGIC)
        while True:
            head = self.f.read(CHUNK.size)
            if len(head) < CHUNK.size:
                return self._cut(pos, "its end marker is missing")
            kind, length, checksum = CHUNK.unpack(head)
            payload = self.f.read(length)
            end = pos + CHUNK.size + length
            where = f"bytes {pos} to {end}"
            if kind not in (HEADER, ROWS, END) or (kind == HEADER) != (chunks == 0):
                return self._damaged(f"a chunk of unknown kind at byte {pos}")
            if len(payload) < length:
                return self._cut(pos, f"inside the chunk at byte {pos}")
            if xxh3_64_intdigest(payload) != checksum:
                return self._damaged(f"the chunk at {where} fails its checksum")
            try:
                if kind == HEADER:
                    self.header = _header(msgpack.unpackb(payload, raw=False, strict_map_key=False))
                elif kind == ROWS:
                    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
                    unpacker.feed(payload)
                    self.rows.extend(tuple(row) for row in unpacker)
                else:
                    n_chunks, n_rows, n_bytes = msgpack.unpackb(payload)
                    if (n_chunks, n_rows, n_bytes) != (chunks, len(self.rows), pos):
                        return self._damaged(
                            f"its end marker counts {n_chunks} chunks, {n_rows} rows and "
                            f"{n_bytes} bytes, the file has {chunks}, {len(self.rows)} and {pos}"
                        )
                    if end != self.size:
                        return self._damaged(f"{self.size - end} bytes follow its end marker")
                    return None
            except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
                return self._damaged(f"the chunk at {where} cannot be read ({exc})")
            chunks, pos = chunks + 1, end

    def _cut(self, pos: int, what: str) -> str:
        return (
            f"the checkpoint file {self.path} is cut short: it ends at byte {self.size}, "
            f"{what}; the rows after byte {pos} are lost"
        )

    def _damaged(self, what: str) -> str:
        return f"the checkpoint file {self.path} is damaged: {what}"


class _LegacyReader:
    """Reads a format-1 checkpoint: a msgpack header, then rows, no checksum."""

    def __init__(self, f: IO[bytes], path: Path, size: int) -> None:
        self.f, self.path, self.size = f, path, size
        self.header: dict[str, Any] | None = None
        self.rows: Rows = []

    def read(self) -> str | None:
        unpacker = msgpack.Unpacker(
            self.f, raw=False, strict_map_key=False, max_buffer_size=2**31 - 1
        )
        try:
            self.header = _header(unpacker.unpack())
            for row in unpacker:
                self.rows.append(tuple(row))
        except msgpack.OutOfData:
            pass
        except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
            return (
                f"the checkpoint file {self.path} (format 1) is damaged near byte "
                f"{unpacker.tell()}: {exc}"
            )
        if self.header is None or unpacker.tell() != self.size:
            return (
                f"the checkpoint file {self.path} (format 1) is cut short: it ends at byte "
                f"{self.size}, inside the "
                + ("header" if self.header is None else f"row after byte {unpacker.tell()}")
            )
        return None


def _header(value: Any) -> dict[str, Any]:
    """A checkpoint's header, checked for what loading it needs (KeyError, TypeError)."""
    if not isinstance(value, dict):
        raise TypeError(f"a header of type {type(value).__name__}")
    for key in ("lsn", "next_tid", "tables"):
        if key not in value:
            raise KeyError(f"the header has no {key!r}")
    return value
