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
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

from rocksdict import (
    BlockBasedOptions,
    Cache,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

META = struct.Struct("<ddIIQ")
LSN_KEY = b"\x00lsn"
NEXT_TID_KEY = b"\x00next_tid"


def table_prefix(tag: bytes, tid: int) -> bytes:
    """``tag`` + the table id as 4 big-endian bytes."""
    return tag + tid.to_bytes(4, "big")


class RocksStore:
    """A RocksDB database tuned for large values and a bounded memory footprint.

    All methods block; the engine calls them through :class:`~app.storage.blocking.BlockingIO`.
    """

    def __init__(self, path: Path, *, write_buffer_mb: int = 8, block_cache_mb: int = 8) -> None:
        path.mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(write_buffer_mb * 1024 * 1024)
        opts.set_max_write_buffer_number(2)
        table = BlockBasedOptions()
        table.set_block_cache(Cache(block_cache_mb * 1024 * 1024))
        table.set_cache_index_and_filter_blocks(True)
        opts.set_block_based_table_factory(table)
        self._db = Rdict(str(path), opts)
        self._nowal = WriteOptions()
        self._nowal.disable_wal = True  # type: ignore[method-assign,assignment]
        self._closed = False

    def write(
        self,
        puts: Sequence[tuple[bytes, bytes]] = (),
        deletes: Sequence[bytes] = (),
        delete_ranges: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """Apply puts, deletes and range deletes in one atomic batch."""
        batch = WriteBatch(raw_mode=True)
        for begin, end in delete_ranges:
            batch.delete_range(begin, end)
        for key in deletes:
            batch.delete(key)
        for key, value in puts:
            batch.put(key, value)
        self._db.write(batch, self._nowal)

    def get(self, key: bytes) -> bytes | None:
        """One value, or None."""
        value: bytes | None = self._db.get(key)
        return value

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """Values in the order asked, None where missing."""
        if not keys:
            return []
        values: list[bytes | None] = self._db.get(keys)  # type: ignore[arg-type,assignment]
        return values

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) whose key starts with ``prefix``, in key order."""
        it = self._db.iter()
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                break
            yield key, it.value()
            it.next()

    def flush(self) -> None:
        """Persist the memtables to SST files (makes every earlier write durable)."""
        self._db.flush(True)

    def live_bytes(self) -> int:
        """RocksDB's estimate of the live data size."""
        value = self._db.property_int_value("rocksdb.estimate-live-data-size")
        return int(value or 0)

    def close(self) -> None:
        """Flush and close; idempotent."""
        if not self._closed:
            self._closed = True
            self._db.flush(True)
            self._db.close()
