"""One server per data directory: a lock file, ``server.lock``, holding the server's pid.

``rlreplay serve`` takes the lock before it binds its port, so a second server on the same
data directory stops at once with a message naming the process that holds it, rather than
listening first and failing in its recovery. The lock is a POSIX record lock (``lockf``): the
kernel drops it when the process ends, however it ends, and a child process (the log
writer) does not inherit it. The holder's pid comes from the kernel (``F_GETLK``) where the
platform lays ``struct flock`` out as Linux does, else from the file, where the holder
writes it.

RocksDB's own ``rocksdb/LOCK`` is checked the same way, so a process that opened the
directory's database without this lock (an embedded engine) is named too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import sys
from pathlib import Path

__all__ = ["LOCK_FILE", "DataDirInUse", "DataDirLock"]

LOCK_FILE = "server.lock"
#: What ``lockf`` fails with on a filesystem without record locks.
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})
#: ``struct flock`` on Linux: l_type, l_whence, l_start, l_len, l_pid (and padding).
_FLOCK = struct.Struct("hhqqi4x")


class DataDirInUse(RuntimeError):
    """Another process holds the data directory.

    Attributes:
        pid: That process's id, when the platform tells it.
    """

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


def _holder(fd: int) -> int | None:
    """The pid of the process holding a write lock on ``fd``'s file (None: unknown or free)."""
    if not sys.platform.startswith("linux"):
        return None
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    except OSError:
        return None
    l_type, _, _, _, pid = _FLOCK.unpack(answer)
    return int(pid) if l_type != fcntl.F_UNLCK and pid > 0 else None


def _written_pid(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return None


class DataDirLock:
    """The lock of one data directory, held from :meth:`acquire` until :meth:`release` or
    the end of the process.

    Args:
        data_dir: The data directory (created if missing).
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None
        #: False where the filesystem has no record locks (some network filesystems).
        self.supported = True

    def acquire(self) -> None:
        """Take the lock and write this process's pid into it.

        Raises:
            DataDirInUse: Another process holds this lock or the directory's RocksDB.
            OSError: The directory cannot be created or the lock file written.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _NO_LOCKS:  # RocksDB's own lock still guards the directory
                os.close(fd)
                self.supported = False
                return
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                os.close(fd)
                raise
            pid = _holder(fd) or _written_pid(self.path)
            os.close(fd)
            raise self._in_use("another rlreplay server", pid) from None
        try:
            self._check_rocksdb()
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _check_rocksdb(self) -> None:
        lock = self.data_dir / "rocksdb" / "LOCK"
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return  # no database yet
        try:
            pid = _holder(fd)
        finally:
            os.close(fd)
        if pid is not None:
            raise self._in_use("another process (it has its RocksDB open)", pid)

    def _in_use(self, who: str, pid: int | None) -> DataDirInUse:
        named = f"{who} (pid {pid})" if pid is not None else who
        return DataDirInUse(
            f"data dir {str(self.data_dir)!r} is in use by {named}; stop it or pick "
            "another --data-dir",
            pid,
        )

    def release(self) -> None:
        """Let go of the lock (idempotent); the file stays."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
