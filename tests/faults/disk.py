"""A small real filesystem that can be filled: a tmpfs mounted for one test (CI runs as
root; a machine where mounting is not allowed fails these tests rather than skipping them)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def small_disk(where: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` MiB mounted at ``where`` for the block."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, (
        f"these tests mount a tmpfs (as root, as CI runs them): {done.stderr.strip()}"
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, name: str = "filler") -> Path:
    """Write a file on ``disk`` until it is full; returns the file (delete it to free)."""
    path = disk / name
    chunk = bytes(1 << 16)
    with open(path, "ab") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    # the last partial writes: a few bytes may still fit
    with contextlib.suppress(OSError), open(path, "ab") as f:
        while True:
            f.write(b"\0" * 512)
            f.flush()
            os.fsync(f.fileno())
    return path
