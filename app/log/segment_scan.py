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

from collections.abc import Iterator
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
    ZEROS,
    LogRecoveryError,
    header_problem,
)
from rlreplay.app.log.segment_reader import SegmentReader

_UINT_SIZES = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}  # msgpack's unsigned ints
_INT_SIZES = {0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}  # ... and signed ones
_ARRAY_HEADERS = {0xDC: 2, 0xDD: 4}  # array 16 and array 32: their length's bytes


@dataclass(frozen=True, slots=True)
class Run:
    """Whole records one after another in a segment (region paddings between them), the
    first at byte ``start``, with LSNs ``first`` to ``last``; read back by
    :func:`read_run`."""

    start: int
    first: int
    last: int


@dataclass(slots=True)
class SegmentScan:
    """What :func:`scan_segment` found in one segment: where its records lie, their
    checksums verified (the records themselves are read later, by :func:`read_run`).

    Attributes:
        path: The segment.
        records: Its whole records before the first stop (one run, or none).
        empty: The file has no byte at all.
        header: What is wrong with its header block (None: whole, or format 1).
        stop: Why the records end: ``end``, ``previous use``, or what was wrong there.
        stop_at: The byte where they end (after the last whole record).
        resumed: Whole records with higher LSNs found past the stop, a run per stretch.
        resumed_at: The byte where the first of them starts.
        regions_after: Region ends (paddings) between the stop and the last of them.
    """

    path: Path
    records: list[Run] = field(default_factory=list)
    empty: bool = False
    header: str | None = None
    stop: str = "end"
    stop_at: int = 0
    resumed: list[Run] = field(default_factory=list)
    resumed_at: int = 0
    regions_after: int = 0

    @property
    def last_lsn(self) -> int | None:
        """The LSN of its last whole record before the stop (None: there is none)."""
        return self.records[-1].last if self.records else None

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
    """Go through ``path`` (blocking), verifying each record's checksum, and return where
    its records lie and what ended them. The segment is read a window at a time, its
    records only as far as their LSNs."""
    with SegmentReader(path) as segment:
        return _scan(segment)


def _scan(segment: SegmentReader) -> SegmentScan:
    path = segment.path
    scan = SegmentScan(path)
    if not segment.size:
        scan.empty = True
        return scan
    name = int(path.stem)
    start = 0
    if segment.read(0, len(SEGMENT_MAGIC)) == SEGMENT_MAGIC:
        scan.header = header_problem(segment.read(0, BLOCK), name)
        start = BLOCK
    chain = _Chain(segment, floor=name - 1)
    chain.run(start)
    scan.records, scan.stop, scan.stop_at = chain.runs, chain.stop, chain.stop_at
    if chain.stop in ("end", "previous use"):
        return scan
    # look past the stop for whole records with higher LSNs, as long as there are any
    floor = scan.last_lsn if scan.last_lsn is not None else name - 1
    pos, regions = chain.jumped_at, 0
    while True:
        if pos is None:
            pos = _next_record(segment, chain.stop_at, floor)
        if pos is None:
            break
        more = _Chain(segment, floor=floor)
        more.run(pos)
        if not more.runs:
            break
        if not scan.resumed:
            scan.resumed_at = pos
        scan.resumed.extend(more.runs)
        scan.regions_after = regions + more.paddings_before_last
        regions += more.paddings
        floor = more.runs[-1].last
        if more.stop in ("end", "previous use"):
            break
        chain, pos = more, more.jumped_at
    return scan


class _Chain:
    """Whole records read one after another from a byte offset, each LSN one past the last
    (the first past ``floor``), and where and why they stop."""

    def __init__(self, segment: SegmentReader, *, floor: int) -> None:
        self.segment, self.floor = segment, floor
        self.runs: list[Run] = []  # the records read (one run, or none)
        self.stop, self.stop_at = "end", 0
        self.jumped_at: int | None = None  # a whole record whose LSN jumps starts here
        self.paddings = 0  # region ends passed
        self.paddings_before_last = 0  # ... before the last record

    def run(self, pos: int) -> None:
        segment, frame = self.segment, FRAME
        read, size = segment.read, segment.size
        first: tuple[int, int] | None = None  # the first record: its byte, its LSN
        prev: int | None = None
        self.stop_at = pos
        try:
            while pos + frame.size <= size:
                length, crc = frame.unpack_from(read(pos, frame.size))
                if length == 0 and crc == 0:
                    end = min((pos // BLOCK + 1) * BLOCK, size)
                    if bytes(read(pos, end - pos)) != ZEROS[: end - pos]:  # memcmp
                        self.stop = f"bad padding at byte {pos}"
                        return
                    self.paddings += 1
                    pos = end
                    continue
                lsn = _checked_lsn(segment, pos, length, crc)
                if lsn is None:
                    self.stop = f"a record cut short or failing its checksum at byte {pos}"
                    return
                if lsn <= (self.floor if prev is None else prev):
                    self.stop = "previous use"  # a recycled segment's old records
                    return
                if prev is not None and lsn != prev + 1:
                    self.stop, self.jumped_at = f"record {lsn} following {prev} at byte {pos}", pos
                    return
                if first is None:
                    first = (pos, lsn)
                prev = lsn
                self.paddings_before_last = self.paddings
                pos += frame.size + length
                self.stop_at = pos
            if pos < size and not segment.zeros_from(pos):
                self.stop = f"a record cut short at byte {pos}"
        finally:
            if first is not None and prev is not None:
                self.runs = [Run(first[0], first[1], prev)]


def _checked_lsn(segment: SegmentReader, pos: int, length: int, crc: int) -> int | None:
    """The LSN of the whole record framed at ``pos`` with ``length`` and ``crc`` (None:
    cut short or failing its checksum); its checksum is verified, and its payload read
    only as far as its LSN."""
    if length == 0 or pos + FRAME.size + length > segment.size:
        return None
    payload = segment.read(pos + FRAME.size, length)
    if xxh3_64_intdigest(payload) != crc:
        return None
    lsn = _lsn_at(payload, length)
    if lsn is None:
        raise LogRecoveryError(
            f"log {segment.path.name}: the record at byte {pos} passes its checksum but "
            "cannot be read (it does not start with an LSN)"
        )
    return lsn


def _lsn_at(payload: memoryview, length: int) -> int | None:
    """The LSN a record's payload of ``length`` bytes begins with (a msgpack array whose
    first element is an integer), or None if it does not look like a record's; ``payload``
    holds its first bytes (up to 16: all it takes)."""
    end = min(length, len(payload))
    head = payload[0]
    pos = 1
    if 0x90 <= head <= 0x9F:
        count = head - 0x90
    elif head in _ARRAY_HEADERS:
        pos += _ARRAY_HEADERS[head]
        count = int.from_bytes(payload[1:pos], "big")
    else:
        return None
    if not count or pos >= end:
        return None
    tag = payload[pos]
    if tag <= 0x7F:
        return int(tag)
    if tag >= 0xE0:
        return int(tag) - 0x100
    nbytes = _UINT_SIZES.get(tag) or _INT_SIZES.get(tag)
    if nbytes is None or pos + 1 + nbytes > end:
        return None
    return int.from_bytes(payload[pos + 1 : pos + 1 + nbytes], "big", signed=tag in _INT_SIZES)


def _next_record(segment: SegmentReader, after: int, floor: int) -> int | None:
    """The first block boundary past ``after`` where a whole record with an LSN above
    ``floor`` starts (None: there is none)."""
    size = segment.size
    pos = (after // BLOCK + 1) * BLOCK
    while pos + FRAME.size <= size:
        length, crc = FRAME.unpack_from(segment.read(pos, FRAME.size))
        if 0 < length <= size - pos - FRAME.size:
            lsn = _lsn_at(segment.read(pos + FRAME.size, min(length, 16)), length)
            # the LSN first: a recycled segment's old records are passed over unread
            if lsn is not None and lsn > floor:
                try:
                    if _checked_lsn(segment, pos, length, crc) is not None:
                        return pos
                except LogRecoveryError:
                    pass
        pos += BLOCK
    return None


def _frames(segment: SegmentReader, pos: int) -> Iterator[tuple[int, int, int]]:
    """The records framed one after another from ``pos`` (region paddings skipped): their
    byte offsets, payload lengths and checksums, as long as frames fit in the segment."""
    read, size, frame = segment.read, segment.size, FRAME
    while pos + frame.size <= size:
        length, crc = frame.unpack_from(read(pos, frame.size))
        if length == 0 and crc == 0:
            pos = min((pos // BLOCK + 1) * BLOCK, size)
            continue
        yield pos, length, crc
        pos += frame.size + length


def position_of(segment: SegmentReader, run: Run, lsn: int) -> int:
    """The byte where the record ``lsn`` of ``run`` starts (its frames read, not the
    records)."""
    for i, (pos, _, _) in enumerate(_frames(segment, run.start)):
        if run.first + i == lsn:
            return pos
    raise LogRecoveryError(f"log {segment.path.name}: record {lsn} is no longer in it")


def read_run(segment: SegmentReader, run: Run, lo: int, hi: int) -> Iterator[tuple[list[Any], int]]:
    """The records of ``run`` with LSNs ``lo`` to ``hi`` (within it), read one at a time,
    with their framed sizes (blocking). Each is checked again against its checksum and its
    place: the scan verified them, and a segment changed since (it is locked meanwhile)
    raises :class:`LogRecoveryError`."""
    if lo > hi:
        return
    lsn = run.first
    for pos, length, crc in _frames(segment, run.start):
        if lsn >= lo:
            payload = segment.read(pos + FRAME.size, length)
            if len(payload) != length or xxh3_64_intdigest(payload) != crc:
                raise LogRecoveryError(
                    f"log {segment.path.name}: the record at byte {pos} changed after "
                    "replay checked it"
                )
            yield _decoded(payload, segment.path, pos, lsn), FRAME.size + length
        if lsn >= hi:
            return
        lsn += 1
    raise LogRecoveryError(f"log {segment.path.name}: records {lsn} to {hi} are no longer in it")


def _decoded(payload: memoryview, path: Path, pos: int, lsn: int) -> list[Any]:
    """The record ``payload`` holds (it passed its checksum), which must be ``lsn``."""
    try:
        record = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        if record[0] != lsn:
            raise ValueError(f"LSN {record[0]!r} where {lsn} was read")
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise LogRecoveryError(
            f"log {path.name}: the record at byte {pos} passes its checksum but "
            f"cannot be read ({exc})"
        ) from exc
    return list(record)
