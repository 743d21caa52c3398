"""A log segment read for replay through a window of bounded size.

Replay goes through a segment front to back (twice: see :mod:`rlreplay.app.log.replay`),
reading it with ``pread`` a window at a time, so what it holds of a segment is one window
(or one record longer than that) however long the segment is. A read error is an
``OSError`` naming the file (a mapped file's would be a ``SIGBUS`` that ends the process).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

#: Bytes read at a time (a longer record is read by itself).
WINDOW = 4 << 20
_ZERO_CHUNK = bytes(1 << 20)


class SegmentReader:
    """One segment file open for reading (blocking; a context manager that closes it).

    Attributes:
        path: The segment.
        size: Its length when opened.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._at = 0  # the window holds the bytes from here
        self._window = memoryview(b"")
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.size = os.fstat(self._fd).st_size
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except BaseException:
            self.close()
            raise

    def read(self, pos: int, n: int) -> memoryview:
        """Bytes ``pos`` to ``pos + n`` (fewer past the end of the file): from the window,
        which moves to ``pos`` when they are not all in it."""
        end = pos + n
        if end > self.size:
            end = self.size
        at = self._at
        if at <= pos and end <= at + len(self._window):
            return self._window[pos - at : end - at]
        if end - pos > WINDOW:  # a record longer than the window: read by itself
            return memoryview(self._pread(pos, end - pos))
        self._window = memoryview(b"")  # the old one goes before the new one is read
        self._window = memoryview(self._pread(pos, min(WINDOW, self.size - pos)))
        self._at = pos
        return self._window[: end - pos]

    def zeros_from(self, pos: int) -> bool:
        """Whether every byte from ``pos`` to the end is zero."""
        chunk = len(_ZERO_CHUNK)
        while pos < self.size:
            part = self.read(pos, chunk)
            if bytes(part) != _ZERO_CHUNK[: len(part)]:  # a memoryview compares bytewise
                return False
            pos += len(part)
        return True

    def _pread(self, pos: int, n: int) -> bytes:
        """``n`` bytes from ``pos``, read whole (a file shorter than when it was opened:
        only those it still has)."""
        if self._fd is None:
            raise ValueError(f"{self.path.name} is closed")
        parts = []
        while n > 0:
            try:
                part = os.pread(self._fd, n, pos)
            except OSError as exc:
                raise OSError(exc.errno, f"{exc.strerror} at byte {pos}", str(self.path)) from exc
            if not part:
                break
            parts.append(part)
            pos, n = pos + len(part), n - len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        """Close the file; idempotent."""
        self._window = memoryview(b"")
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
