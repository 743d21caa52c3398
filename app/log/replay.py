"""Replay of the write-ahead log's segments: every whole record after a checkpoint, in order,
and a check that the log on disk holds every record from the checkpoint's position on.

It goes in two passes, so a replay never holds the log in memory: :func:`plan_replay` goes
through every segment checking each record's checksum and reading only its LSN (what is
missing or damaged is all found then, before any record is applied), and the
:class:`ReplayPlan` it returns reads the records back a batch at a time.

A segment's name is the first LSN it may hold: records that a failed flush left in the
segment before it, at or past that name, were refused and are skipped (a gap after a
segment's name is those refused records). A torn tail ends a segment: a crash interrupted
it, and the next process started the next segment right after its last whole record.

What is refused (reported to :class:`~rlreplay.app.log.data_loss.DataLoss`, which stops the
start unless told otherwise):

- a hole before the first segment: it starts past the record after the checkpoint's
  position (a segment deleted, or the checkpoint lost or replaced by an older one);
- a segment the manifest lists that is gone, unless every record it held is checkpointed;
- a manifest that is gone while the log is of format 2 (whose folder always has one once a
  record or a checkpoint position was written): what it listed cannot be checked;
- a log folder with neither a manifest nor a segment while the log is marked in use
  (:mod:`rlreplay.app.log.in_use`): it was removed after a crash;
- a segment shorter than the size the manifest records for it: it was cut after its
  records were answered (a crash never shortens a segment: see
  :mod:`rlreplay.app.log.segments`);
- a gap between segments;
- damage inside a segment: whole records with higher LSNs after bytes that cannot be read,
  further on than the flushes that can be in flight at a crash (see
  :mod:`rlreplay.app.log.segment_scan`); a segment that is empty or whose header is
  damaged, in a log with a manifest (every segment then had a header before its name).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlreplay.app.log.data_loss import DataLoss
from rlreplay.app.log.framing import (
    BLOCK,
    SEGMENT_MAGIC,
    SEGMENT_SUFFIX,
    SPARE_SUFFIX,
    LogRecoveryError,
    segment_name,
)
from rlreplay.app.log.manifest import MANIFEST as MANIFEST_NAME
from rlreplay.app.log.manifest import LogManifest, read_manifest
from rlreplay.app.log.segment_reader import SegmentReader
from rlreplay.app.log.segment_scan import Run, SegmentScan, position_of, read_run, scan_segment

log = logging.getLogger("rlreplay.app.log.wal")

#: A batch of records read back: up to this many bytes of log, or this many records.
BATCH_BYTES = 8 << 20
BATCH_RECORDS = 1024


@dataclass(slots=True)
class ReplayResult:
    """What a replay leaves for the log to go on from.

    Attributes:
        found: The segments kept: (first LSN, path, last LSN).
        highest: The highest LSN any segment names or holds (new records go above it
            once records were dropped, so none of them is ever read as one of theirs).
    """

    found: list[tuple[int, Path, int]] = field(default_factory=list)
    highest: int = 0


def plan_replay(
    folder: Path,
    after_lsn: int,
    *,
    loss: DataLoss,
    result: ReplayResult,
    mark: Path | None = None,
) -> ReplayPlan:
    """Find every whole record with LSN > ``after_lsn`` (blocking): the plan that reads them
    back, oldest first. Fills ``result`` (``mark``: the log's in-use mark,
    :mod:`rlreplay.app.log.in_use`, if it has one). Whatever is missing or damaged goes to
    ``loss``, which raises :class:`LogRecoveryError` unless the start may go on (see its
    policies): all of it is found before a record is read back."""
    plan = ReplayPlan()
    paths = sorted(folder.glob(f"*{SEGMENT_SUFFIX}"), key=lambda p: int(p.stem))
    names = [int(p.stem) for p in paths]
    result.highest = max([after_lsn, *(n - 1 for n in names)])
    try:
        manifest = read_manifest(folder)
    except LogRecoveryError as exc:
        loss.found(exc.kind, str(exc))
        manifest = None
    cut: set[int] = set()  # segments cut short
    if manifest is not None:
        _check_listed(manifest, names, after_lsn, loss)
        cut = _check_sizes(folder, manifest, names, after_lsn, loss)
    else:
        _check_manifest_gone(folder, paths, loss, mark)
    if paths and names[0] > after_lsn + 1:
        gone = [] if manifest is None else [n for n in manifest.segments if n < names[0]]
        _hole_before(paths[0], after_lsn, manifest, gone, loss)
        if loss.log_policy == "prefix":
            _set_aside(paths)
            return plan
    previous: tuple[Path, int] | None = None  # the segment before: path, last LSN
    for i, path in enumerate(paths):
        name = names[i]
        limit = names[i + 1] if i + 1 < len(names) else None
        if previous is not None and name > max(previous[1], after_lsn) + 1:
            expected = max(previous[1], after_lsn) + 1
            loss.found(
                "log_missing",
                f"log {path.name} starts at record {name}, but {previous[0].name} ends at "
                f"record {previous[1]}: records {expected} to {name - 1} are missing",
            )
            if loss.log_policy == "prefix":
                _set_aside(paths[i:])
                break
        scan = scan_segment(path)
        runs, stop = _records_of(scan, name, limit, after_lsn, manifest, loss)
        for run in scan.records + scan.resumed:
            result.highest = max(result.highest, run.last)
        seg_last = name - 1
        for run in runs:
            last = run.last
            if limit is not None and last >= limit:
                refused = max(run.first, limit)
                with SegmentReader(path) as segment:
                    pos = position_of(segment, run, refused)
                log.warning(
                    "log %s: records from %d (byte %d) were refused by a failed flush: skipped",
                    path.name,
                    refused,
                    pos,
                )
                last = refused - 1
            if last >= run.first:
                seg_last = last
                plan.add(path, run, max(run.first, after_lsn + 1), last)
            if last < run.last:
                break
        result.found.append((name, path, seg_last))
        previous = (path, seg_last)
        if stop or (name in cut and loss.log_policy == "prefix"):
            _set_aside(paths[i + 1 :])
            break
    return plan


@dataclass(frozen=True, slots=True)
class _Part:
    """Records of one run of a segment to read back: LSNs ``lo`` to ``hi``."""

    path: Path
    run: Run
    lo: int
    hi: int


@dataclass(slots=True)
class ReplayPlan:
    """The records a replay gives back, found by :func:`plan_replay` (which checked their
    checksums and reported what is missing or damaged) and read back from the segments a
    batch at a time, so a replay holds about a batch of records however long
    the log is.

    Attributes:
        count: How many records it gives back.
        last: The highest LSN among them (None: none).
    """

    _parts: list[_Part] = field(default_factory=list)
    count: int = 0
    last: int | None = None

    def add(self, path: Path, run: Run, lo: int, hi: int) -> None:
        """Give back the records ``lo`` to ``hi`` of ``run`` in ``path`` (none if lo > hi)."""
        if lo > hi:
            return
        self._parts.append(_Part(path, run, lo, hi))
        self.count += hi - lo + 1
        self.last = hi

    def batches(
        self, *, max_bytes: int = BATCH_BYTES, max_records: int = BATCH_RECORDS
    ) -> Generator[list[list[Any]], None, None]:
        """The records, oldest first, in batches of up to ``max_bytes`` of log (framed) or
        ``max_records`` records (blocking: read each in an I/O thread). A segment stays
        open until its last record is read, or the iterator is closed."""
        segment: SegmentReader | None = None
        batch: list[list[Any]] = []
        size = 0
        try:
            for part in self._parts:
                if segment is None or segment.path != part.path:
                    if segment is not None:
                        segment.close()
                    segment = SegmentReader(part.path)
                for record, framed in read_run(segment, part.run, part.lo, part.hi):
                    batch.append(record)
                    size += framed
                    if size >= max_bytes or len(batch) >= max_records:
                        yield batch
                        batch, size = [], 0
            if batch:
                yield batch
        finally:
            if segment is not None:
                segment.close()

    def records(self) -> Iterator[list[Any]]:
        """The records one at a time, oldest first (blocking)."""
        for batch in self.batches():
            yield from batch


def _records_of(
    scan: SegmentScan,
    name: int,
    limit: int | None,
    after_lsn: int,
    manifest: LogManifest | None,
    loss: DataLoss,
) -> tuple[list[Run], bool]:
    """The runs of records of a scanned segment to replay, and whether replay ends with
    them (the segment was damaged, and the policy replays up to the damage)."""
    path = scan.path
    newest = limit is None
    holds_more = newest or (limit is not None and limit - 1 > max(after_lsn, name - 1))
    if scan.empty:
        if manifest is not None and holds_more:
            last = "on" if limit is None else f"to {limit - 1}"
            loss.found(
                "log_damaged",
                f"log {path.name} is empty (0 bytes), but it was started with a header "
                f"before any record went into it: records from {name} {last} are lost",
            )
            return [], loss.log_policy == "prefix"
        return [], False
    top = None if limit is None else limit - 1
    lost = [
        (max(r.first, after_lsn + 1), r.last if top is None else min(r.last, top))
        for r in scan.resumed
    ]
    lost = [(lo, hi) for lo, hi in lost if lo <= hi]
    if scan.header is not None or (lost and scan.damaged(newest=newest)):
        loss.found("log_damaged", _damage(scan, name, lost))
        if loss.log_policy == "prefix":
            return scan.records, True
        return scan.records + scan.resumed, False
    if scan.stop == "previous use":
        log.info(
            "log %s: records of the file's previous use from byte %d (it is a recycled "
            "segment): it ends there",
            path.name,
            scan.stop_at,
        )
    elif scan.stop != "end":
        log.warning("log %s: torn tail (%s), it ends there", path.name, scan.stop)
    return scan.records, False


def _damage(scan: SegmentScan, name: int, lost: list[tuple[int, int]]) -> str:
    """One sentence naming the damage in ``scan``'s segment (``lost``: the LSN ranges of
    the whole records past it)."""
    path = scan.path
    if scan.header is not None and not lost:
        return f"log {path.name} is damaged: {scan.header}"
    first_lost = (scan.last_lsn if scan.last_lsn is not None else name - 1) + 1
    first, last = lost[0][0], lost[-1][1]
    missing = (
        ""
        if first <= first_lost
        else f"record {first_lost} is lost"
        if first == first_lost + 1
        else f"records {first_lost} to {first - 1} are lost"
    )
    header = f"; {scan.header}" if scan.header is not None else ""
    return (
        f"log {path.name} is damaged at bytes {scan.stop_at} to {scan.resumed_at} "
        f"({scan.stop}), with whole records {first} to {last} after it in "
        f"{scan.regions_after + 1} flush regions (a crash leaves at most the last 3 "
        f"unwritten){header}" + (f": {missing}" if missing else "")
    )


def _check_manifest_gone(
    folder: Path, paths: list[Path], loss: DataLoss, mark: Path | None
) -> None:
    """Report a manifest removed from a log of format 2: without it, a newest segment (or
    any segment after the last on disk) that is gone looks like the end of the log. The
    manifest is written before a record goes into a segment, but after a new log's first
    segment takes its name (with its header alone): such a folder, or one of format 1
    (from an older server, which never had a manifest), is not missing one."""
    if not paths and mark is not None and mark.exists():
        loss.found(
            "log_missing",
            f"the log in {folder} is gone (no MANIFEST, no segment), while "
            f"{mark} says the server that wrote it did not stop with every "
            "record checkpointed: the records answered after the checkpoint's position are "
            "lost",
        )
        return
    written = [p for p in paths if _starts_with_header(p) and p.stat().st_size > BLOCK]
    if not written:
        return
    loss.found(
        "log_missing",
        f"the log's manifest {folder / MANIFEST_NAME} is missing, while {written[-1].name} "
        "is a segment of log format 2 (whose folder always has one): it cannot tell "
        "whether segments after the last one on disk are gone",
    )


def _starts_with_header(path: Path) -> bool:
    """Whether ``path`` starts as a segment of log format 2 does."""
    try:
        with path.open("rb") as f:
            return f.read(len(SEGMENT_MAGIC)) == SEGMENT_MAGIC
    except OSError:
        return False


def _check_listed(manifest: LogManifest, names: list[int], after_lsn: int, loss: DataLoss) -> None:
    """Report the segments ``manifest`` lists past the last one on disk that are gone and
    may hold records after ``after_lsn`` (one gone before another is a gap, which replay
    names)."""
    newest = max(names, default=0)
    listed = manifest.segments
    gone = []
    for i, first in enumerate(listed):
        if first <= newest:
            continue
        bounds = [n for n in (*names, *listed[i + 1 :]) if n > first]
        bound = min(bounds, default=None)
        if bound is not None and bound - 1 <= after_lsn:
            continue  # every record it held is in the checkpoint
        held = f"records {first} to {bound - 1}" if bound is not None else f"records from {first}"
        gone.append(f"{segment_name(first)} ({held})")
    if gone:
        loss.found(
            "log_missing",
            f"log segment{'s' if len(gone) > 1 else ''} {', '.join(gone)} listed in the "
            "log's MANIFEST " + ("are" if len(gone) > 1 else "is") + " missing",
        )


def _check_sizes(
    folder: Path, manifest: LogManifest, names: list[int], after_lsn: int, loss: DataLoss
) -> set[int]:
    """Report the segments on disk that are shorter than the manifest records and may hold
    records after ``after_lsn``; returns their names."""
    cut: set[int] = set()
    listed = manifest.segments
    if not manifest.sizes:  # an older server's manifest, or one whose sizes are stale
        return cut
    for i, (first, size) in enumerate(zip(listed, manifest.sizes, strict=True)):
        if first not in names:
            continue
        bounds = [n for n in (*names, *listed[i + 1 :]) if n > first]
        bound = min(bounds, default=None)
        if bound is not None and bound - 1 <= after_lsn:
            continue  # every record it held is in the checkpoint
        path = folder / segment_name(first)
        actual = path.stat().st_size
        if actual >= size or not actual:  # an empty one: replay names it
            continue
        cut.add(first)
        loss.found(
            "log_damaged",
            f"log {path.name} is {actual} bytes, but the log's MANIFEST records it as "
            f"{size} bytes (its size before any record went past byte {actual}): it was "
            f"cut short, and the records it held past byte {actual} are lost",
        )
    return cut


def _hole_before(
    first: Path, after_lsn: int, manifest: LogManifest | None, gone: list[int], loss: DataLoss
) -> None:
    """Report the records missing between the checkpoint's position and the first segment
    (``gone``: the segments before it that the manifest lists)."""
    name = int(first.stem)
    problem = (
        f"{loss.checkpoint} covers the log up to record {after_lsn}, but "
        f"its oldest segment {first.name} starts at record {name}: records {after_lsn + 1} "
        f"to {name - 1} are missing"
    )
    if gone:
        listed = ", ".join(segment_name(n) for n in gone)
        problem += f" (the log's MANIFEST lists {listed} before it, gone)"
    if manifest is not None and manifest.checkpoint > after_lsn and not gone:
        loss.found(
            "checkpoint_missing",
            f"{problem}; the log's MANIFEST says a checkpoint covered records up to "
            f"{manifest.checkpoint}, so {loss.checkpoint} is missing or older than the log",
        )
    else:
        cause = "" if gone else " (a segment was deleted, or the checkpoint lost)"
        loss.found("log_missing", problem + cause)


def drop_spares(folder: Path) -> None:
    """Delete the spare segments: after records were dropped, new LSNs jump past every one on
    disk, and a spare's old records must never sit in front of them."""
    for spare in folder.glob(f"*{SPARE_SUFFIX}"):
        spare.unlink(missing_ok=True)


def _set_aside(paths: list[Path]) -> None:
    """Rename segments past a gap to ``*.skipped``: kept for a person to look at, out of
    the way of the segments that take their names."""
    for path in paths:
        aside = path.with_name(path.name + ".skipped")
        log.warning("log %s: set aside as %s, not replayed", path.name, aside.name)
        os.rename(path, aside)
