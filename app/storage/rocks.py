"""RocksDB through ``rocksdict``, in raw bytes mode, with the layout the engine persists.

Layout (every key starts with a one-byte tag):

- ``t<name>``            → msgpack ``{"id": tid, "config": {...}}`` of a table
- ``m<tid:4><key>``      → item metadata ``<d d I I Q`` (priority, inserted_at, times_sampled,
  size, insertion order), then the msgpack of its indexed fields for plugin samplers
- ``v<tid:4><key>``      → the item's value (msgpack bytes as pushed)
- ``\\x00lsn``            → the last log sequence number the store covers (8 bytes)
- ``\\x00next_tid``       → the next table id to hand out

Writes skip RocksDB's own WAL: the engine's log covers them, and a checkpoint calls
:meth:`RocksStore.flush` before that log is truncated.

A failed write or flush (a full disk, an I/O error) raises :class:`OSError` and leaves
RocksDB refusing every later write (its background error), with no way to resume it
through rocksdict; :meth:`RocksStore.recover` reopens the database and writes back what
its memtables held, which the reopening would otherwise lose (there is no RocksDB WAL).

Damage is told apart from those: RocksDB checks a checksum on every block it reads (reads,
iterators, compactions) and on every MANIFEST record, and reports a mismatch as a status
whose message starts with ``Corruption``. Any call that meets one raises
:class:`~rlreplay.app.storage.faults.StorageDamaged` naming the file, and the store keeps it
as :attr:`RocksStore.damage`: :meth:`RocksStore.recover` never reopens over it (a reopening
clears RocksDB's error, and the next compaction meets the same block). Opening reads every
block once (:meth:`RocksStore.verify`), so damage is refused at the start rather than found
by a read later; rocksdict's iterators end quietly on an error, so every scan checks the
iterator's status when it ends.
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import re
import shutil
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from rocksdict import (
    BlockBasedOptions,
    Cache,
    Checkpoint,
    DBCompressionType,
    Env,
    Options,
    Rdict,
    RdictIter,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from rlreplay.app.storage.faults import StorageDamaged

log = logging.getLogger(__name__)

_MAX_UNFLUSHED = 100_000  # keys remembered for recover() before write() flushes itself
_REOPEN_SPACE = 4 << 20  # free space recover() wants beyond the values it writes back
_VERIFY_READAHEAD = 4 << 20  # bytes read ahead while verify() reads every block once
# the file a RocksDB "Corruption" status names: "... in /data/rocksdb/000012.sst offset 0",
# "The file /data/rocksdb/MANIFEST-000005 may be corrupted", "CURRENT file corrupted"
_NAMED_FILE = re.compile(r"(/[^\s:,]+?\.sst)\b|The file (\S+) may be corrupted|(CURRENT) file")


#: Levels 0 and 1 uncompressed, then Snappy (RocksDB's default) for the levels below.
_COMPRESSION_PER_LEVEL = [DBCompressionType.none()] * 2 + [DBCompressionType.snappy()] * 5


def _background_env() -> Env:
    """RocksDB's environment with its compaction threads at the lowest CPU priority: on a
    busy machine they take what the event loop leaves (a compaction only has to keep up
    on average; a write that would wait for one is refused and tried again, see
    :meth:`RocksStore.try_write`). Flushes keep their priority. Applies to the process's
    default environment, which every database of the process shares."""
    env = Env()
    env.lower_thread_pool_cpu_priority()
    return env


class _WriteStalled(Exception):
    """A write with ``no_slowdown`` that RocksDB would have made wait (nothing written)."""


def lock_still_open(lock: Path) -> bool:
    """Whether this process still has ``lock`` (a database's ``LOCK`` file) open: a dropped
    handle that something in a reference cycle still holds (an iterator in a traceback).
    True where ``/proc/self/fd`` cannot tell."""
    target = os.path.realpath(lock)
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return True
    for fd in fds:
        try:
            opened = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listing the folder, or one closed meanwhile
            continue
        if opened in (target, f"{target} (deleted)"):
            return True
    return False


def is_corruption(exc: BaseException) -> bool:
    """Whether a RocksDB error (rocksdict raises plain Exceptions) reports damage."""
    return "Corruption" in str(exc)


class RocksStore:
    """A RocksDB database tuned for large values and a bounded memory footprint.

    All methods block; the engine calls them through
    :class:`~rlreplay.workers.blocking.BlockingIO`.

    Raises:
        StorageDamaged: (from the constructor, with ``verify``) a file of the database is
            damaged; the message names it.
        OSError: RocksDB could not open the folder (held by another process, no space).
    """

    def __init__(
        self,
        path: Path,
        *,
        write_buffer_mb: int = 32,
        block_cache_mb: int = 8,
        verify: bool = True,
    ) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self._path = path
        # damage found while opening is the caller's to report (the start's one refusal
        # line); once open, what a read or write meets is logged here, naming the file
        self._opened = False
        self._write_buffer_mb = write_buffer_mb
        self._block_cache_mb = block_cache_mb
        #: The damage a RocksDB call found (it never goes away); None while none was met.
        self.damage: StorageDamaged | None = None
        current = path / "CURRENT"
        if not current.exists() and any(path.glob("MANIFEST-*")):
            # RocksDB would start a new, empty database beside the old one's files
            raise StorageDamaged(
                f"RocksDB file {current} is missing, while {path} holds a database's "
                "MANIFEST: the database cannot be opened",
                file=str(current),
            )
        try:
            self._db: Rdict | None = self._open()
        except Exception as exc:
            raise self._failed(exc, "open") from exc
        self._nowal = WriteOptions()
        self._nowal.disable_wal = True  # type: ignore[method-assign,assignment]
        # the same, but a write that would wait for a flush fails at once (try_write)
        self._nowal_or_none = WriteOptions()
        self._nowal_or_none.disable_wal = True  # type: ignore[method-assign,assignment]
        self._nowal_or_none.no_slowdown = True
        self._closed = False
        # Keys and ranges written since the last flush that succeeded: what the memtables
        # may hold and a reopening would lose (kept as keys only; recover() reads values).
        self._unflushed: dict[bytes, None] = {}
        self._unflushed_ranges: list[tuple[bytes, bytes]] = []
        #: The error RocksDB refuses writes with, until recover() succeeds; None when healthy.
        self.failure: OSError | None = None
        # readers in I/O threads hold the handle while recover() swaps it
        self._readers = 0
        self._swapping = False
        self._handle = threading.Condition()
        if verify:
            try:
                self.verify()
            except BaseException:
                try:
                    self._db.close()
                except Exception as exc:  # a compaction may have met the same damage
                    log.info("RocksDB in %s closed with its error: %s", path, exc)
                self._drop_handle()
                raise
        self._opened = True

    @contextmanager
    def _reading(self) -> Iterator[Rdict]:
        with self._handle:
            while self._swapping:
                self._handle.wait()
            self._readers += 1
        try:
            if self._db is None:
                raise OSError(errno.EIO, f"RocksDB in {self._path} could not be reopened")
            yield self._db
        finally:
            with self._handle:
                self._readers -= 1
                if not self._readers:
                    self._handle.notify_all()

    def _open(self) -> Rdict:
        path, write_buffer_mb, block_cache_mb = (
            self._path,
            self._write_buffer_mb,
            self._block_cache_mb,
        )
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        # refuse to open on damage found while opening (RocksDB's default, said aloud)
        opts.set_paranoid_checks(True)
        opts.set_write_buffer_size(write_buffer_mb * 1024 * 1024)
        opts.set_max_write_buffer_number(2)
        # what flushes write (level 0, and 1) is rewritten soon: left uncompressed
        opts.set_compression_per_level(_COMPRESSION_PER_LEVEL)
        opts.set_env(_background_env())
        table = BlockBasedOptions()
        table.set_block_cache(Cache(block_cache_mb * 1024 * 1024))
        table.set_cache_index_and_filter_blocks(True)
        opts.set_block_based_table_factory(table)
        return Rdict(str(path), opts)

    def _drop_handle(self) -> None:
        """Let go of the closed database, so that its lock on the folder goes with it.

        ``close()`` releases the lock unless an iterator still holds the database; one
        held by a reference cycle goes only with a full collection, which costs time in
        proportion to every object the process holds, so it runs only when needed.
        """
        self._db = None
        if lock_still_open(self._path / "LOCK"):
            gc.collect()

    def _live(self) -> Rdict:
        """The open database (the writer's calls; readers go through _reading)."""
        if self._db is None:
            raise OSError(errno.EIO, f"RocksDB in {self._path} could not be reopened")
        return self._db

    def _failed(self, exc: Exception, what: str) -> OSError:
        """The OSError for a RocksDB error (rocksdict raises plain Exceptions): damage is
        :class:`StorageDamaged` and stays :attr:`damage`; any failure refuses writes until
        :meth:`recover` (RocksDB's background error)."""
        text = str(exc)
        if is_corruption(exc):
            self.failure = self.damage = self._damaged(text, what)
            return self.damage
        code = errno.ENOSPC if "No space left" in text else errno.EIO
        if "Too many open files" in text:
            code = errno.EMFILE
        error = OSError(code, f"RocksDB {what} failed in {self._path}: {text}")
        self.failure = error
        return error

    def _damaged(self, text: str, what: str) -> StorageDamaged:
        """The error for RocksDB's ``Corruption`` status ``text``, naming the damaged file."""
        named = _NAMED_FILE.search(text)
        if named is None:
            file = str(self._path)
        elif named.group(3):
            file = str(self._path / "CURRENT")
        else:
            file = named.group(1) or named.group(2)
        if self._opened:
            log.error("RocksDB in %s is damaged: %s failed on %s: %s", self._path, what, file, text)
        return StorageDamaged(f"RocksDB file {file} is damaged ({what} failed: {text})", file=file)

    def _read_failed(self, exc: Exception) -> OSError:
        """The OSError for a failed read: damage, or an I/O error (reads set no failure)."""
        if is_corruption(exc):
            return self._failed(exc, "read")
        return OSError(errno.EIO, f"RocksDB read failed in {self._path}: {exc}")

    def write(
        self,
        puts: Sequence[tuple[bytes, bytes]] = (),
        deletes: Sequence[bytes] = (),
        delete_ranges: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """Apply puts, deletes and range deletes in one atomic batch."""
        self._write(self._nowal, puts, deletes, delete_ranges)

    def try_write(
        self,
        puts: Sequence[tuple[bytes, bytes]] = (),
        deletes: Sequence[bytes] = (),
        delete_ranges: Sequence[tuple[bytes, bytes]] = (),
    ) -> bool:
        """:meth:`write`, unless RocksDB would make it wait for a memtable flush: then
        nothing is written and it returns False (call again a few milliseconds later).

        rocksdict holds the GIL through a write, waits included: a write that waited for
        the flush behind it would stop every thread of the process, the event loop too.
        """
        try:
            self._write(self._nowal_or_none, puts, deletes, delete_ranges)
        except _WriteStalled:
            return False
        return True

    def _write(
        self,
        options: WriteOptions,
        puts: Sequence[tuple[bytes, bytes]],
        deletes: Sequence[bytes],
        delete_ranges: Sequence[tuple[bytes, bytes]],
    ) -> None:
        batch = WriteBatch(raw_mode=True)
        for begin, end in delete_ranges:
            batch.delete_range(begin, end)
        for key in deletes:
            batch.delete(key)
        for key, value in puts:
            batch.put(key, value)
        try:
            self._live().write(batch, options)
        except Exception as exc:
            if options is self._nowal_or_none and "Write stall" in str(exc):
                raise _WriteStalled from None
            raise self._failed(exc, "write") from exc
        unflushed = self._unflushed
        unflushed.update(dict.fromkeys(deletes))
        unflushed.update(dict.fromkeys([key for key, _ in puts]))
        self._unflushed_ranges.extend(delete_ranges)
        if len(unflushed) > _MAX_UNFLUSHED:  # keeps what recover() must remember bounded
            self.flush()

    def get(self, key: bytes) -> bytes | None:
        """One value, or None."""
        with self._reading() as db:
            try:
                value: bytes | None = db.get(key)
            except Exception as exc:
                raise self._read_failed(exc) from exc
        return value

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """Values in the order asked, None where missing."""
        if not keys:
            return []
        with self._reading() as db:
            try:
                values: list[bytes | None] = db.get(keys)  # type: ignore[arg-type,assignment]
            except Exception as exc:
                raise self._read_failed(exc) from exc
        return values

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) whose key starts with ``prefix``, in key order.

        Raises:
            StorageDamaged: A block on the way is damaged (rocksdict's iterator would end
                there as if the keys were all read).
        """
        it = self._live().iter()
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                return
            yield key, it.value()
            it.next()
        error = self._ended_on(it)
        del it  # a traceback that held it would hold the database (and its lock) open
        if error is not None:
            raise error

    def _ended_on(self, it: RdictIter) -> OSError | None:
        """The error an iterator ended on, if it ended on one."""
        try:
            it.status()
        except Exception as exc:  # its message is in the error; its traceback would hold it
            return self._read_failed(exc)
        return None

    def verify(self) -> int:
        """Read every block of the database once, checking its checksum; the keys counted.

        RocksDB checks a block only when something reads it, and opening reads none of the
        blocks that hold items, so without this a damaged block would be found by a read
        (or a compaction) once the server serves. It costs one sequential read of the
        database (keys only reach Python), outside the block cache.

        Raises:
            StorageDamaged: A block is damaged; the message names its file.
        """
        options = ReadOptions()
        options.set_verify_checksums(True)
        options.set_readahead_size(_VERIFY_READAHEAD)
        options.fill_cache(False)  # type: ignore[call-arg]
        it = self._live().iter(options)
        it.seek_to_first()
        n = 0
        while it.valid():
            n += 1
            it.next()
        error = self._ended_on(it)
        del it
        if error is not None:
            raise error
        return n

    def flush(self) -> None:
        """Persist the memtables to SST files (makes every earlier write durable)."""
        try:
            self._live().flush(True)
        except Exception as exc:
            raise self._failed(exc, "flush") from exc
        self._unflushed = {}
        self._unflushed_ranges = []

    def recover(self) -> None:
        """After a failed write or flush: reopen the database, write back what it held
        since the last flush, and flush. Raises OSError if the disk still refuses; call it
        again later. Reads keep working meanwhile (RocksDB serves them in its error state).
        """
        if self.failure is None:
            return
        if self.damage is not None:  # a reopening would hide it until the next compaction
            # a new error each time: raising the same one again would grow its traceback
            raise StorageDamaged(str(self.damage), file=self.damage.file)
        keys = list(self._unflushed)
        values = self.get_many(keys) if keys else []
        need = sum(len(v) for v in values if v is not None) + _REOPEN_SPACE
        free = shutil.disk_usage(self._path).free
        if free < need:  # reopening on a full disk could leave no database at all
            raise OSError(
                errno.ENOSPC,
                f"RocksDB in {self._path} waits for {need} bytes of free space ({free} free)",
            )
        ranges = list(self._unflushed_ranges)
        with self._handle:
            self._swapping = True
            while self._readers:
                self._handle.wait()
        try:
            try:
                if self._db is not None:
                    self._db.close()
            except Exception as exc:  # it tries a last flush, which fails the same way
                log.info("RocksDB in %s closed with its error: %s", self._path, exc)
            self._drop_handle()
            try:
                self._db = self._open()
            except Exception as exc:
                raise self._failed(exc, "reopen") from exc
        finally:
            with self._handle:
                self._swapping = False
                self._handle.notify_all()
        batch = WriteBatch(raw_mode=True)
        for begin, end in ranges:
            batch.delete_range(begin, end)
        for key, value in zip(keys, values, strict=True):
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        try:
            self._live().write(batch, self._nowal)
            self._live().flush(True)
        except Exception as exc:
            raise self._failed(exc, "write after reopening") from exc
        self._unflushed, self._unflushed_ranges = {}, []
        self.failure = None
        log.warning("RocksDB in %s reopened after its error; writes go on", self._path)

    def checkpoint_to(self, dest: Path) -> None:
        """A consistent copy of the database in ``dest`` (which must not exist): RocksDB's
        checkpoint, hard links to its immutable table files, so it takes milliseconds and
        no space until compaction replaces those files. Call :meth:`flush` first: writes
        skip RocksDB's WAL, so the memtables' contents would not be in the copy."""
        try:
            Checkpoint(self._live()).create_checkpoint(str(dest))
        except Exception as exc:  # the database itself is unharmed: no failure state
            code = errno.ENOSPC if "No space left" in str(exc) else errno.EIO
            raise OSError(code, f"RocksDB checkpoint to {dest} failed: {exc}") from exc

    def live_bytes(self) -> int:
        """RocksDB's estimate of the live data size."""
        with self._reading() as db:
            value = db.property_int_value("rocksdb.estimate-live-data-size")
        return int(value or 0)

    def close(self) -> None:
        """Flush and close; idempotent."""
        if not self._closed and self._db is not None:
            self._closed = True
            try:
                self._db.flush(True)
            except Exception as exc:  # the engine's log still holds what was not flushed
                log.error("RocksDB in %s: the last flush failed: %s", self._path, exc)
            try:
                self._db.close()
            except Exception as exc:
                log.error("RocksDB in %s: close failed: %s", self._path, exc)
            self._drop_handle()
