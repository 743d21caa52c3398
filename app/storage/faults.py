"""Storage faults: which contract error an ``OSError`` becomes, and how long to wait before
trying a failed background write again.

A full disk (``ENOSPC``, ``EDQUOT``) is a state the service waits out: writes answer 507
``storage_full`` naming the full path, and come back by themselves. Damage that storage found
in its own files (:class:`StorageDamaged`: a RocksDB block or MANIFEST whose checksum does not
match) is not a state that passes: it answers 500 ``internal`` naming the file, and the
server reports itself unhealthy so that an orchestrator restarts it (the start then refuses
the damaged data by name). Any other ``OSError`` (``EIO``, ``EMFILE``...) answers 503
``unavailable``, which clients retry.
"""

from __future__ import annotations

import errno
import time

from rlreplay.wire.errors import ReplayError, StorageFull, Unavailable

__all__ = ["Backoff", "StorageDamaged", "is_disk_full", "storage_error"]

_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class StorageDamaged(OSError):
    """Storage found a file of the data directory damaged (a checksum that does not match,
    a garbled MANIFEST or CURRENT): what it held cannot be read back, and no retry helps.

    Attributes:
        file: The damaged file, as the storage named it (the database's folder when it did
            not say which file).
    """

    def __init__(self, message: str, *, file: str) -> None:
        super().__init__(errno.EIO, message)
        self.file = file

    def __str__(self) -> str:
        return self.strerror or ""


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in _DISK_FULL


def storage_error(exc: OSError, where: str) -> ReplayError:
    """The contract's error for a write refused because storage at ``where`` failed."""
    reason = exc.strerror or str(exc)
    if isinstance(exc, StorageDamaged):
        return ReplayError(
            f"storage is damaged ({reason}): this request changed nothing; the server must "
            "be restarted, and its start then refuses the damaged file by name"
        )
    if is_disk_full(exc):
        return StorageFull(
            f"the disk holding {where} is full ({reason}): nothing of this request was "
            "applied; writes resume once space is freed"
        )
    return Unavailable(
        f"a write to {where} failed ({reason}): nothing of this request was applied; retry",
        retry_after=1.0,
    )


class Backoff:
    """Exponential backoff between tries of a failing background write (a checkpoint, an
    eviction): ``due`` says whether to try now, ``failed`` and ``succeeded`` move it."""

    def __init__(self, *, first_s: float = 0.1, most_s: float = 5.0) -> None:
        self._first_s = first_s
        self._most_s = most_s
        self._delay_s = 0.0
        self.next_try = 0.0  # time.monotonic() from which the next try is due
        self.failures = 0  # in a row

    @property
    def failing(self) -> bool:
        """Whether the last try failed."""
        return self.failures > 0

    def due(self) -> bool:
        """Whether a try is due now."""
        return time.monotonic() >= self.next_try

    def failed(self) -> None:
        """A try failed: the next one waits longer."""
        self.failures += 1
        self._delay_s = min(self._most_s, max(self._first_s, 2 * self._delay_s))
        self.next_try = time.monotonic() + self._delay_s

    def succeeded(self) -> None:
        """A try worked: the next failure starts from the shortest wait."""
        self.failures = 0
        self._delay_s = 0.0
        self.next_try = 0.0
