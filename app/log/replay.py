"""Replay of the write-ahead log's segments: every whole record after a checkpoint, in order.

A segment's name is the first LSN it may hold: records that a failed flush left in the
segment before it, at or past that name, were refused and are skipped (a gap after a
segment's name is those refused records). A torn tail ends a segment: a crash interrupted
it, and the next process started the next segment right after its last whole record. So a
segment that starts past the end of the one before is a gap, which strict replay refuses.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlreplay.app.log.framing import SEGMENT_SUFFIX, LogRecoveryError, read_segment

log = logging.getLogger("rlreplay.app.log.wal")


def replay_segments(
    folder: Path, after_lsn: int, *, strict: bool, found: list[tuple[int, Path, int]]
) -> Iterator[list[Any]]:
    """Yield every whole record with LSN > ``after_lsn``, oldest first (blocking), and
    append each segment kept to ``found`` as (first LSN, path, last LSN).

    A gap raises :class:`LogRecoveryError` naming it, unless ``strict`` is False: replay
    then stops at the gap with a warning and sets the later segments aside, as RocksDB's
    point-in-time recovery does.
    """
    paths = sorted(folder.glob(f"*{SEGMENT_SUFFIX}"), key=lambda p: int(p.stem))
    previous: tuple[Path, int] | None = None  # the segment before: path, last LSN
    for i, path in enumerate(paths):
        name = int(path.stem)
        limit = int(paths[i + 1].stem) if i + 1 < len(paths) else None
        if previous is not None and name > max(previous[1], after_lsn) + 1:
            expected = max(previous[1], after_lsn) + 1
            problem = (
                f"log {path.name} starts at record {name}, but {previous[0].name} ends at "
                f"record {previous[1]}: records {expected} to {name - 1} are missing"
            )
            if strict:
                raise LogRecoveryError(
                    problem + " (--wal-recovery point-in-time recovers up to the gap)"
                )
            log.warning("%s: replay stops at the gap (point-in-time recovery)", problem)
            _set_aside(paths[i:])
            break
        seg_last = name - 1
        for record, pos in read_segment(path):
            if limit is not None and record[0] >= limit:
                log.warning(
                    "log %s: records from %d (byte %d) were refused by a failed flush: skipped",
                    path.name,
                    record[0],
                    pos,
                )
                break
            seg_last = record[0]
            if record[0] > after_lsn:
                yield record
        found.append((name, path, seg_last))
        previous = (path, seg_last)


def _set_aside(paths: list[Path]) -> None:
    """Rename segments past a gap to ``*.skipped``: kept for a person to look at, out of
    the way of the segments that take their names."""
    for path in paths:
        aside = path.with_name(path.name + ".skipped")
        log.warning("log %s: set aside as %s, not replayed", path.name, aside.name)
        os.rename(path, aside)
