"""Reading one log segment back: its whole records, and what ended them.

The records of a segment follow each other from its header (or byte 0, in log format 1)
with LSNs one apart. What ends them is one of:

- the end of the file, or zeros to it (the rest was never written);
- records of the file's previous use (a recycled segment): LSNs below its name;
- a record that fails its checksum or is cut short, bad padding, or an LSN that jumps.

The last is either a torn tail (a crash cut the flushes in flight short: at most
:data:`~rlreplay.app.log.flushes.MAX_IN_FLIGHT` regions) or damage. The scan looks past it,
at each block boundary (every flush region starts on one), for whole records with higher
LSNs, and counts the regions they lie in by their padding (every region ends in some): whole
records further on than the flushes that can be in flight mean the bytes before them were
damaged after they were written (see :meth:`SegmentScan.damaged`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from xxhash import xxh3_64_intdigest

from rlreplay.app.log.flushes import MAX_IN_FLIGHT
from rlreplay.app.log.framing import (
    BLOCK,
    FRAME,
    SEGMENT_MAGIC,
    LogRecoveryError,
    header_problem,
)


@dataclass(slots=True)
class SegmentScan:
    """What :func:`scan_segment` found in one segment.

    Attributes:
        path: The segment.
        records: Its whole records before the first stop, with their byte offsets.
        empty: The file has no byte at all.
        header: What is wrong with its header block (None: whole, or format 1).
        stop: Why the records end: ``end``, ``previous use``, or what was wrong there.
        stop_at: The byte where they end (after the last whole record).
        resumed: Whole records with higher LSNs found past the stop, with their offsets.
        resumed_at: The byte where the first of them starts.
        regions_after: Region ends (paddings) between the stop and the last of them.
    """

    path: Path
    records: list[tuple[list[Any], int]] = field(default_factory=list)
    empty: bool = False
    header: str | None = None
    stop: str = "end"
    stop_at: int = 0
    resumed: list[tuple[list[Any], int]] = field(default_factory=list)
    resumed_at: int = 0
    regions_after: int = 0

    @property
    def last_lsn(self) -> int | None:
        """The LSN of its last whole record before the stop (None: there is none)."""
        return self.records[-1][0][0] if self.records else None

    def damaged(self, *, newest: bool) -> bool:
        """Whether the stop is damage rather than a torn tail: whole records with higher
        LSNs follow it in more regions than the flushes in flight at a crash (in the newest
        segment), or at all (in an older one: it was closed whole), or its header is bad."""
        if self.header is not None:
            return True
        if not self.resumed:
            return False
        return not newest or self.regions_after + 1 > MAX_IN_FLIGHT


def scan_segment(path: Path) -> SegmentScan:
    """Read ``path`` whole (blocking) and return its records and what ended them."""
    data = path.read_bytes()
    scan = SegmentScan(path)
    if not data:
        scan.empty = True
        return scan
    name = int(path.stem)
    start = 0
    if data[: len(SEGMENT_MAGIC)] == SEGMENT_MAGIC:
        scan.header = header_problem(data, name)
        start = BLOCK
    chain = _Chain(data, path, floor=name - 1)
    chain.run(start)
    scan.records, scan.stop, scan.stop_at = chain.records, chain.stop, chain.stop_at
    if chain.stop in ("end", "previous use"):
        return scan
    # look past the stop for whole records with higher LSNs, as long as there are any
    floor = scan.last_lsn if scan.last_lsn is not None else name - 1
    pos, regions = chain.jumped_at, 0
    while True:
        if pos is None:
            pos = _next_record(data, chain.stop_at, floor)
        if pos is None:
            break
        more = _Chain(data, path, floor=floor)
        more.run(pos)
        if not more.records:
            break
        if not scan.resumed:
            scan.resumed_at = pos
        scan.resumed.extend(more.records)
        scan.regions_after = regions + more.paddings_before_last
        regions += more.paddings
        floor = more.records[-1][0][0]
        if more.stop in ("end", "previous use"):
            break
        chain, pos = more, more.jumped_at
    return scan


class _Chain:
    """Whole records read one after another from a byte offset, each LSN one past the last
    (the first past ``floor``), and where and why they stop."""

    def __init__(self, data: bytes, path: Path, *, floor: int) -> None:
        self.data, self.path, self.floor = data, path, floor
        self.records: list[tuple[list[Any], int]] = []
        self.stop, self.stop_at = "end", 0
        self.jumped_at: int | None = None  # a whole record whose LSN jumps starts here
        self.paddings = 0  # region ends passed
        self.paddings_before_last = 0  # ... before the last record

    def run(self, pos: int) -> None:
        data, frame = self.data, FRAME
        prev: int | None = None
        self.stop_at = pos
        while pos + frame.size <= len(data):
            length, crc = frame.unpack_from(data, pos)
            if length == 0 and crc == 0:
                end = min((pos // BLOCK + 1) * BLOCK, len(data))
                if data.count(0, pos, end) != end - pos:
                    self.stop = f"bad padding at byte {pos}"
                    return
                self.paddings += 1
                pos = end
                continue
            record = _record_at(data, pos, self.path)
            if record is None:
                self.stop = f"a record cut short or failing its checksum at byte {pos}"
                return
            lsn = record[0]
            if lsn <= (self.floor if prev is None else prev):
                self.stop = "previous use"  # a recycled segment's old records
                return
            if prev is not None and lsn != prev + 1:
                self.stop, self.jumped_at = f"record {lsn} following {prev} at byte {pos}", pos
                return
            prev = lsn
            self.records.append((record, pos))
            self.paddings_before_last = self.paddings
            pos += frame.size + length
            self.stop_at = pos
        if pos < len(data) and data.count(0, pos) != len(data) - pos:
            self.stop = f"a record cut short at byte {pos}"


def _record_at(data: bytes, pos: int, path: Path) -> list[Any] | None:
    """The whole record framed at ``pos`` (None: cut short or failing its checksum)."""
    length, crc = FRAME.unpack_from(data, pos)
    start, end = pos + FRAME.size, pos + FRAME.size + length
    if length == 0 or end > len(data):
        return None
    with memoryview(data) as view:
        if xxh3_64_intdigest(view[start:end]) != crc:
            return None
    try:
        record = msgpack.unpackb(data[start:end], raw=False, strict_map_key=False)
        lsn = record[0]
        if not isinstance(lsn, int):
            raise TypeError(f"LSN {lsn!r}")
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise LogRecoveryError(
            f"log {path.name}: the record at byte {pos} passes its checksum but "
            f"cannot be read ({exc})"
        ) from exc
    return list(record)


def _next_record(data: bytes, after: int, floor: int) -> int | None:
    """The first block boundary past ``after`` where a whole record with an LSN above
    ``floor`` starts (None: there is none)."""
    pos = (after // BLOCK + 1) * BLOCK
    while pos + FRAME.size <= len(data):
        length, _ = FRAME.unpack_from(data, pos)
        if 0 < length <= len(data) - pos - FRAME.size:
            lsn = _lsn_at(data, pos + FRAME.size, length)
            # the LSN first: a recycled segment's old records are passed over unread
            if lsn is not None and lsn > floor:
                try:
                    if _record_at(data, pos, Path("scan")) is not None:
                        return pos
                except LogRecoveryError:
                    pass
        pos += BLOCK
    return None


def _lsn_at(data: bytes, start: int, length: int) -> int | None:
    """The LSN a payload at ``start`` begins with, if it looks like a record's."""
    unpacker = msgpack.Unpacker()
    unpacker.feed(data[start : start + min(length, 16)])
    try:
        unpacker.read_array_header()
        lsn = unpacker.unpack()
    except (ValueError, msgpack.UnpackException):
        return None
    return lsn if isinstance(lsn, int) else None
