"""The mark that the log holds records the checkpoint does not (``<data-dir>/LOG_IN_USE``),
so a start can tell a log folder that was removed from one that was never needed.

The log writes the mark when it opens for new records, after its first segment and its
manifest are in place and before any record is answered, and removes it when it closes with
every record it holds covered by a checkpoint (a clean stop's final checkpoint). A start
that finds the mark but neither a manifest nor a segment in the log folder refuses: the
records answered after the checkpoint's position are gone (as PostgreSQL refuses a start
whose ``pg_control`` says the cluster was in production while its WAL is gone). Without the
mark (a clean stop, a restore, a server that never opened the log), an empty log folder has
lost nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

IN_USE = (
    "LOG_IN_USE"  # the mark's name in the data dir (beside the log folder, which removing it keeps)
)


def mark_in_use(path: Path) -> None:
    """Write the mark ``path``, durably (blocking)."""
    if path.exists():
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _sync_folder(path.parent)


def mark_not_needed(path: Path) -> None:
    """Remove the mark ``path``, durably (blocking): the checkpoint covers every record
    the log holds."""
    if not path.exists():
        return
    path.unlink(missing_ok=True)
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
