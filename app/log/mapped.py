"""A log segment mapped read-only for replay, its pages given back as the reading moves on.

Replay reads a segment through a shared read-only ``mmap``: its pages are the page cache's,
which the kernel can drop under pressure, but while mapped they count in the process's
resident memory. :meth:`MappedSegment.passed` unmaps the pages a read has gone past, a
window at a time, so a replay's resident memory stays within about one window however long
the segment is (a page read again after that is simply faulted back in).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from types import TracebackType

#: Bytes read past before they are given back (also the chunk zeros are compared in).
WINDOW = 4 << 20
_ZERO_CHUNK = bytes(1 << 20)


class MappedSegment:
    """One segment file mapped read-only (blocking; a context manager that unmaps it).

    Attributes:
        path: The segment.
        data: Its bytes (an empty ``bytes`` for an empty file, which cannot be mapped).
        size: Its length.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: mmap.mmap | bytes = b""
        self._released = 0  # pages below this offset were given back
        with path.open("rb") as f:
            self.size = os.fstat(f.fileno()).st_size
            if self.size:
                self.data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if isinstance(self.data, mmap.mmap):
            self.data.madvise(mmap.MADV_SEQUENTIAL)

    def passed(self, pos: int) -> None:
        """The reading has gone past byte ``pos``: give back the pages before it, once a
        window of them has gathered."""
        if pos - self._released < WINDOW or not isinstance(self.data, mmap.mmap):
            return
        end = pos - pos % mmap.PAGESIZE
        self.data.madvise(mmap.MADV_DONTNEED, self._released, end - self._released)
        self._released = end

    def zeros_from(self, pos: int) -> bool:
        """Whether every byte from ``pos`` to the end is zero (compared a chunk at a time,
        each given back once passed)."""
        chunk = len(_ZERO_CHUNK)
        while pos < self.size:
            end = min(pos + chunk, self.size)
            if self.data[pos:end] != _ZERO_CHUNK[: end - pos]:
                return False
            pos = end
            self.passed(pos)
        return True

    def close(self) -> None:
        """Unmap the segment; idempotent."""
        if isinstance(self.data, mmap.mmap):
            self.data.close()
        self.data = b""

    def __enter__(self) -> MappedSegment:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
