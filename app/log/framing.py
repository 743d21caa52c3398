"""How the write-ahead log lies on disk: frames, aligned regions, segment files.

Records are framed ``<length:u32><xxh3_64:u64><msgpack payload>``; the payload is a list
whose first element is the record's LSN. The log is a folder of segment files named by
the first LSN they may hold; within a segment, LSNs follow each other without gaps.

Each flush writes one region that starts and ends on a 4096-byte boundary of the segment:
its frames back to back, then zero padding (none, or at least one frame header's worth).
A zero frame header (length 0, checksum 0; payloads are never empty) reads as "padding: skip
to the next boundary". Aligned regions let the log write with ``O_DIRECT`` from one reusable
page-aligned buffer; where the filesystem refuses ``O_DIRECT`` the same regions are written
buffered, so there is one on-disk format. Every region ends in padding (at least a zero
frame header), so the regions' ends can be counted on disk: replay tells a torn tail (the
last flushes in flight) from damage with whole records after it by them (see
:mod:`rlreplay.app.log.segment_scan`).

A segment (log format 2) starts with a header block: :data:`SEGMENT_MAGIC`, the format, the
segment's first LSN and a checksum, written and fsynced before the segment takes its name, so
a segment file that is empty or has no header was damaged, never left so by a crash. A
segment of format 1 (an older server's: no header, frames from byte 0) is read as before.
"""

from __future__ import annotations

import os
import struct

from xxhash import xxh3_64_intdigest

FRAME = struct.Struct("<IQ")  # payload length, xxh3_64 of the payload
BIN32 = struct.Struct(">BI")  # msgpack's bin 32 header (0xc6, length)
SEGMENT_SUFFIX = ".wal"
SPARE_SUFFIX = ".spare"  # a segment no longer needed, kept to be reused as a new one
BLOCK = 4096  # O_DIRECT alignment of file offsets, write lengths and the buffer's address
O_DIRECT: int = getattr(os, "O_DIRECT", 0)
ZEROS = bytes(2 * BLOCK)  # the longest padding is BLOCK + FRAME.size - 1 bytes
LOG_FORMAT = 2  # segments with a header block; format 1 had none
SEGMENT_MAGIC = b"RLRWAL\x00\x02"
SEGMENT_HEADER = struct.Struct("<8sIQQ")  # magic, format, first LSN, xxh3_64 of the rest


class LogRecoveryError(RuntimeError):
    """The data on disk cannot give back everything that was answered: a log segment missing
    or damaged, a gap, a record that cannot be read or applied, a checkpoint missing or
    damaged. The message names the file, the bytes or the records, and how to go on; a
    server refuses to start with it (exit status 3) unless told to accept the loss.

    Attributes:
        kind: What was found (``log_missing``, ``log_damaged``, ``log_record``,
            ``checkpoint_missing``, ``checkpoint_damaged``), the label of
            ``rlreplay_recovery_data_lost_total`` when a start goes on without it.
    """

    def __init__(self, message: str, *, kind: str = "log_damaged") -> None:
        super().__init__(message)
        self.kind = kind


def segment_name(first_lsn: int) -> str:
    """The file name of the segment whose first LSN is ``first_lsn``."""
    return f"{first_lsn:020d}{SEGMENT_SUFFIX}"


def region_size(framed: int) -> int:
    """Bytes one flush of ``framed`` bytes of frames takes on disk, padding included.

    The region ends on a block boundary after padding long enough to hold a zero frame
    header (so a region's end can be found on disk; padding shorter than that gets a block
    more).
    """
    end = -(-framed // BLOCK) * BLOCK
    if end - framed < FRAME.size:
        end += BLOCK
    return end


def segment_header(first_lsn: int) -> bytes:
    """The header block of a segment whose first LSN is ``first_lsn``."""
    fields = SEGMENT_MAGIC + struct.pack("<IQ", LOG_FORMAT, first_lsn)
    head = SEGMENT_HEADER.pack(SEGMENT_MAGIC, LOG_FORMAT, first_lsn, xxh3_64_intdigest(fields))
    return head + bytes(BLOCK - len(head))


def header_problem(data: bytes | memoryview, first_lsn: int) -> str | None:
    """What is wrong with the header block at the start of ``data`` (None: it is whole and
    names ``first_lsn``); ``data`` starts with :data:`SEGMENT_MAGIC`."""
    if len(data) < SEGMENT_HEADER.size:
        return f"its header is cut short at byte {len(data)}"
    _, fmt, lsn, checksum = SEGMENT_HEADER.unpack_from(data)
    fields = SEGMENT_MAGIC + struct.pack("<IQ", fmt, lsn)
    if checksum != xxh3_64_intdigest(fields):
        return f"its header (bytes 0 to {SEGMENT_HEADER.size}) fails its checksum"
    if fmt != LOG_FORMAT:
        return f"it is of log format {fmt}: this server reads formats 1 and {LOG_FORMAT}"
    if lsn != first_lsn:
        return f"its header names record {lsn} as its first, not {first_lsn}"
    return None
