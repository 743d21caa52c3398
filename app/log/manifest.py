"""The log's manifest (``data/wal/MANIFEST``): which segments the log holds and the position
the last checkpoint covered, so a start can tell a segment or a checkpoint that went missing
from a log that never had them (as RocksDB's MANIFEST tracks its WAL files and PostgreSQL's
``pg_control`` its checkpoint's redo point).

It is rewritten when a segment is started (before a record goes into it) and when a
checkpoint cuts the log (before a segment is deleted), in place: two 4 KiB slots written in
turn, each with a sequence number and a checksum, so a write cut short leaves the other
slot whole and a full disk never stops it (it takes no new block once created).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import msgpack
from xxhash import xxh3_64_intdigest

from rlreplay.app.log.framing import BLOCK, LogRecoveryError

MANIFEST = "MANIFEST"
_MAGIC = b"RLRMANI\x01"
_HEAD = struct.Struct("<8sQI")  # magic, sequence number, payload length
_SUM = struct.Struct("<Q")  # xxh3_64 of the sequence number, length and payload


@dataclass(frozen=True, slots=True)
class LogManifest:
    """What the manifest says.

    Attributes:
        checkpoint: The log position the last checkpoint covered (the log was cut there).
        segments: The first LSNs of the segments the log held, oldest first.
        sizes: The least size in bytes each of them has (one per segment; empty in a
            manifest of an older server): what the segment was given when it was put in
            place (or extended), or its written length once it was closed. A segment
            shorter than that was cut short after its records were answered.
    """

    checkpoint: int
    segments: tuple[int, ...]
    sizes: tuple[int, ...] = ()


class ManifestFile:
    """The manifest of one log folder, open for rewriting (blocking calls)."""

    def __init__(self, folder: Path) -> None:
        self._path = folder / MANIFEST
        self._fd: int | None = None
        self._seq = 0

    def write(self, manifest: LogManifest) -> None:
        """Write ``manifest`` into the older slot and fdatasync."""
        if self._fd is None:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            if os.fstat(self._fd).st_size < 2 * BLOCK:  # both slots' blocks, once
                os.posix_fallocate(self._fd, 0, 2 * BLOCK)
            current = _read_slots(self._path)
            self._seq = max((seq for seq, _ in current), default=0)
        segments, sizes = list(manifest.segments), list(manifest.sizes)
        while True:
            body = {"checkpoint": manifest.checkpoint, "segments": segments, "sizes": sizes}
            payload = msgpack.packb(body)
            if _HEAD.size + len(payload) + _SUM.size <= BLOCK or len(segments) <= 1:
                break
            # never in practice: over ~200 segments, the oldest go
            segments, sizes = segments[1:], sizes[1:] if len(sizes) == len(segments) else []
        self._seq += 1
        head = _HEAD.pack(_MAGIC, self._seq, len(payload))
        checksum = _SUM.pack(xxh3_64_intdigest(head[len(_MAGIC) :] + payload))
        slot = (head + payload + checksum).ljust(BLOCK, b"\0")
        os.pwrite(self._fd, slot, (self._seq % 2) * BLOCK)
        os.fdatasync(self._fd)

    def close(self) -> None:
        """Let go of the file; idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_manifest(folder: Path) -> LogManifest | None:
    """The newest whole slot of ``folder``'s manifest (None: there is no manifest, as in a
    log written by an older server). Raises :class:`LogRecoveryError` when the file is
    there but neither slot is whole."""
    path = folder / MANIFEST
    if not path.exists():
        return None
    slots = _read_slots(path)
    if not slots:
        size = path.stat().st_size
        raise LogRecoveryError(
            f"the log's manifest {path} is damaged (neither of its slots, bytes 0 to "
            f"{min(size, 2 * BLOCK)}, is whole): it cannot tell which segments the log held "
            "or which checkpoint it needs",
            kind="log_damaged",
        )
    _, manifest = max(slots, key=lambda s: s[0])
    if len(slots) == 1 and manifest.sizes and _other_slot_written(path, slots[0][0]):
        # the other slot was damaged, and may have been the newer: a size it lowered (a
        # segment cut to its length when closed) would look like a segment cut short
        manifest = LogManifest(manifest.checkpoint, manifest.segments)
    return manifest


def _other_slot_written(path: Path, seq: int) -> bool:
    """Whether the slot that does not hold sequence number ``seq`` holds any byte."""
    at = BLOCK - (seq % 2) * BLOCK
    with path.open("rb") as f:
        f.seek(at)
        return bool(f.read(BLOCK).strip(b"\0"))


def _read_slots(path: Path) -> list[tuple[int, LogManifest]]:
    """The whole slots of the manifest at ``path``: (sequence number, manifest)."""
    data = path.read_bytes()
    found = []
    for at in (0, BLOCK):
        slot = data[at : at + BLOCK]
        if len(slot) < _HEAD.size + _SUM.size or slot[: len(_MAGIC)] != _MAGIC:
            continue
        _, seq, length = _HEAD.unpack_from(slot)
        end = _HEAD.size + length
        if end + _SUM.size > len(slot):
            continue
        (checksum,) = _SUM.unpack_from(slot, end)
        if checksum != xxh3_64_intdigest(slot[len(_MAGIC) : end]):
            continue
        body = msgpack.unpackb(slot[_HEAD.size : end], raw=False)
        segments, sizes = tuple(body["segments"]), tuple(body.get("sizes", ()))
        if len(sizes) != len(segments):
            sizes = ()
        found.append((seq, LogManifest(int(body["checkpoint"]), segments, sizes)))
    return found
