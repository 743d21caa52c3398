"""How the write-ahead log lies on disk: frames, aligned regions, segment files.

Records are framed ``<length:u32><xxh3_64:u64><msgpack payload>``; the payload is a list
whose first element is the record's LSN. The log is a folder of segment files named by
the first LSN they may hold; within a segment, LSNs follow each other without gaps.

Each flush writes one region that starts and ends on a 4096-byte boundary of the segment:
its frames back to back, then zero padding (none, or at least one frame header's worth).
A zero frame header (length 0, checksum 0; payloads are never empty) reads as "padding: skip
to the next boundary". Aligned regions let the log write with ``O_DIRECT`` from one reusable
page-aligned buffer; where the filesystem refuses ``O_DIRECT`` the same regions are written
buffered, so there is one on-disk format.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
from xxhash import xxh3_64_intdigest

log = logging.getLogger("rlreplay.app.log.wal")

FRAME = struct.Struct("<IQ")  # payload length, xxh3_64 of the payload
BIN32 = struct.Struct(">BI")  # msgpack's bin 32 header (0xc6, length)
SEGMENT_SUFFIX = ".wal"
SPARE_SUFFIX = ".spare"  # a segment no longer needed, kept to be reused as a new one
BLOCK = 4096  # O_DIRECT alignment of file offsets, write lengths and the buffer's address
O_DIRECT: int = getattr(os, "O_DIRECT", 0)
ZEROS = bytes(2 * BLOCK)  # the longest padding is BLOCK + FRAME.size - 1 bytes


class LogRecoveryError(RuntimeError):
    """The log cannot be replayed whole: a gap between segments, or a record that cannot be
    read or applied in the middle of the log. The message names the segment and byte."""


def segment_name(first_lsn: int) -> str:
    """The file name of the segment whose first LSN is ``first_lsn``."""
    return f"{first_lsn:020d}{SEGMENT_SUFFIX}"


def region_size(framed: int) -> int:
    """Bytes one flush of ``framed`` bytes of frames takes on disk, padding included.

    The region ends on a block boundary and its padding is either empty or long enough
    to hold a zero frame header (so it is never 1..7 bytes: those get a block more).
    """
    end = -(-framed // BLOCK) * BLOCK
    if 0 < end - framed < FRAME.size:
        end += BLOCK
    return end


def read_segment(path: Path) -> Iterator[tuple[list[Any], int]]:
    """Yield the whole records of one segment and their byte offsets, stopping at the
    first damaged one.

    A zero frame header is padding up to the next block boundary. A record whose LSN
    does not follow the previous one's ends the segment too: a crash in mid-flush may
    have left a later block of it on disk without an earlier one.
    """
    frame, checksum = FRAME, xxh3_64_intdigest
    data = path.read_bytes()
    pos, prev_lsn, first_lsn = 0, None, int(path.stem)
    while pos + frame.size <= len(data):
        length, crc = frame.unpack_from(data, pos)
        if length == 0 and crc == 0:
            end = min((pos // BLOCK + 1) * BLOCK, len(data))
            if data.count(0, pos, end) != end - pos:
                log.warning("log %s: bad padding at byte %d, it ends there", path.name, pos)
                break
            pos = end
            continue
        start, end = pos + frame.size, pos + frame.size + length
        if end > len(data) or checksum(memoryview(data)[start:end]) != crc:
            log.warning("log %s: torn record at byte %d, it ends there", path.name, pos)
            break
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
        if lsn < first_lsn or (prev_lsn is not None and lsn <= prev_lsn):
            log.info(
                "log %s: records of the file's previous use from byte %d (it is a "
                "recycled segment): it ends there",
                path.name,
                pos,
            )
            break
        if prev_lsn is not None and lsn != prev_lsn + 1:
            log.warning(
                "log %s: record %d follows %d at byte %d, it ends there",
                path.name,
                lsn,
                prev_lsn,
                pos,
            )
            break
        prev_lsn = lsn
        yield record, pos
        pos = end
