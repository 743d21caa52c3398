"""One table of a RocksDB snapshot, read from the backup URL fetching only the files that
hold it (``rlreplay export``).

Every table lives in the one RocksDB, each in its own key ranges (see
:mod:`rlreplay.app.storage.layout`), and RocksDB's own metadata (``MANIFEST-*``) says which
key range each SST file covers. So the files are fetched in rounds into a scratch folder:
first the metadata files (RocksDB's MANIFEST, OPTIONS, CURRENT and its log), then the SST
files that can hold the table records (``t`` keys), then those that overlap the table's
value and metadata ranges. Level-0 files overlap each other and every read opens them
all, so they are always fetched. The database is opened read-only with RocksDB's paranoid
checks off, as the files of other tables are absent on purpose; every read checks its
iterator's status, and if one still needs a file that was left out, the rest of the
snapshot is fetched and the read starts over.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import msgpack
from rocksdict import AccessType, Options, Rdict

from rlreplay.app.backup import BackupStore, Manifest, ProgressInfo, SnapshotCorrupt
from rlreplay.app.storage import layout
from rlreplay.app.tables.items import Item
from rlreplay.wire.errors import TableNotFound

__all__ = ["ROCKSDB", "SnapshotTable"]

log = logging.getLogger("rlreplay.export")

ROCKSDB = "rocksdb"
_TABLE_RECORDS = (b"t", b"u")
#: Rows of a table's metadata read per batch of values.
_META_BATCH = 1024


class _ReadFailed(Exception):
    """RocksDB failed a read of the partial copy (a file it needed was left out)."""


class SnapshotTable:
    """The items of one table of a RocksDB snapshot.

    Args:
        store: The backup store.
        manifest: The snapshot (its files under ``rocksdb/``).
        table: The table to read.
        scratch: An empty folder for the files fetched (removed by the caller).
        progress: Called after each file fetched with the bytes fetched so far and the
            bytes chosen so far.
    """

    def __init__(
        self,
        store: BackupStore,
        manifest: Manifest,
        table: str,
        scratch: Path,
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self._store = store
        self._manifest = manifest
        self.table = table
        self._scratch = scratch
        self._db_dir = scratch / "snapshot" / ROCKSDB
        self._progress = progress
        self._rounds = 0
        self._fetched: dict[str, int] = {}  # path -> size
        self._chosen_bytes = 0
        self._db: Rdict | None = None
        self.tid = -1
        snapshot_files = [f for f in manifest.files if f.path.startswith(f"{ROCKSDB}/")]
        self.files_total = len(snapshot_files)
        self.bytes_total = sum(f.size for f in snapshot_files)

    @property
    def files_fetched(self) -> int:
        """Files fetched so far."""
        return len(self._fetched)

    @property
    def bytes_fetched(self) -> int:
        """Bytes fetched so far."""
        return sum(self._fetched.values())

    def open(self) -> None:
        """Fetch the files that hold the table and open them.

        Raises:
            TableNotFound: The snapshot has no such table; the message names those it has.
            SnapshotCorrupt, BackupUnavailable: The files cannot be fetched or verified.
        """
        self._fetch([f.path for f in self._manifest.files if _is_metadata(f.path)])
        self._fetch(self._overlapping([_TABLE_RECORDS]))
        names: dict[str, int] = {}
        try:
            for key, value in self._scan(*_TABLE_RECORDS):
                names[key[1:].decode()] = int(msgpack.unpackb(value, raw=False)["id"])
        except _ReadFailed:
            self._fetch_everything()
            return self.open()
        if self.table not in names:
            raise TableNotFound(
                f"no table {self.table!r} in snapshot {self._manifest.id}; its tables: "
                f"{', '.join(sorted(names)) or 'none'}"
            )
        self.tid = names[self.table]
        self._fetch(self._overlapping(layout.table_ranges(self.tid)))

    def metadata(self) -> list[tuple[str, float, float, int, int, int]]:
        """Every item's (key, priority, inserted_at, times_sampled, size, order), in
        insertion order."""
        meta_range = layout.table_ranges(self.tid)[1]
        try:
            rows = [
                (layout.item_key_of(raw_key), *layout.unpack_meta(raw)[:5])
                for raw_key, raw in self._scan(*meta_range)
            ]
        except _ReadFailed:
            self._fetch_everything()
            return self.metadata()
        rows.sort(key=lambda row: row[5])
        return rows

    def items(self, rows: list[tuple[str, float, float, int, int, int]]) -> list[Item]:
        """The items of ``rows`` (from :meth:`metadata`), their values read.

        Raises:
            SnapshotCorrupt: A value is missing or cannot be read.
        """
        prefix = layout.table_id(self.tid)
        keys: list[Any] = [layout.value_key(prefix, row[0]) for row in rows]
        try:
            values: list[bytes | None] = cast(Any, self._live().get(keys))  # one multi_get
        except Exception as exc:  # rocksdict raises plain Exceptions
            raise SnapshotCorrupt(f"snapshot {self._manifest.id}: {exc}") from exc
        out = []
        for row, value in zip(rows, values, strict=True):
            if value is None:
                raise SnapshotCorrupt(
                    f"snapshot {self._manifest.id}: the value of key {row[0]!r} of table "
                    f"{self.table!r} is missing"
                )
            out.append(Item(row[0], bytes(value), row[1], row[2], row[3]))
        return out

    def close(self) -> None:
        """Close the database (the scratch folder is the caller's)."""
        db, self._db = self._db, None
        if db is not None:
            db.close()

    # -- fetching -------------------------------------------------------------------------

    def _live(self) -> Rdict:
        if self._db is None:
            opts = Options(raw_mode=True)
            opts.set_paranoid_checks(False)  # the files of other tables are absent
            self._db = Rdict(str(self._db_dir), opts, access_type=AccessType.read_only())
        return self._db

    def _overlapping(self, ranges: list[tuple[bytes, bytes]]) -> list[str]:
        """The SST files that level 0 holds or whose keys overlap one of ``ranges``."""
        paths = []
        for f in self._live().live_files():
            start, end = bytes(f["start_key"]), bytes(f["end_key"])
            if f["level"] == 0 or any(start < hi and end >= lo for lo, hi in ranges):
                paths.append(f"{ROCKSDB}/{str(f['name']).lstrip('/')}")
        return paths

    def _fetch_everything(self) -> None:
        if len(self._fetched) == self.files_total:  # RocksDB fails with every file there
            raise SnapshotCorrupt(
                f"snapshot {self._manifest.id}: RocksDB cannot read table {self.table!r} "
                "even with every file of the snapshot"
            )
        log.warning(
            "snapshot %s: RocksDB needs files beyond table %r's; fetching the rest",
            self._manifest.id,
            self.table,
        )
        self._fetch([f.path for f in self._manifest.files if f.path.startswith(f"{ROCKSDB}/")])

    def _fetch(self, paths: list[str]) -> None:
        """Download ``paths`` (those not fetched yet) and put them in the database folder;
        the database is reopened to see them."""
        todo = sorted(set(paths) - set(self._fetched))
        if not todo:
            return
        self.close()
        sizes = {f.path: f.size for f in self._manifest.files}
        before, self._chosen_bytes = (
            self.bytes_fetched,
            self._chosen_bytes + sum(sizes[p] for p in todo),
        )
        self._rounds += 1
        landing = self._scratch / f"fetch-{self._rounds}"

        def on_file(info: ProgressInfo) -> None:
            if self._progress is not None:
                self._progress(before + info.bytes_done, self._chosen_bytes)

        self._store.download_files(self._manifest, todo, landing, progress=on_file)
        self._db_dir.mkdir(parents=True, exist_ok=True)
        for path in todo:
            (landing / path).rename(self._db_dir / Path(path).name)
            self._fetched[path] = sizes[path]
        shutil.rmtree(landing, ignore_errors=True)

    def _scan(self, lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) in ``[lo, hi)``; :class:`_ReadFailed` if RocksDB could not
        read them all (its iterator ends early on an error, as if the keys were all read)."""
        it: Any = self._live().iter()
        try:
            it.seek(lo)
            while it.valid():
                key = bytes(it.key())
                if key >= hi:
                    break
                yield key, bytes(it.value())
                it.next()
            it.status()
        except Exception as exc:  # rocksdict raises plain Exceptions
            raise _ReadFailed(str(exc)) from exc


def _is_metadata(path: str) -> bool:
    """A file of the database that is not an SST file: RocksDB's MANIFEST, OPTIONS,
    CURRENT, and its log (writes not flushed to SST files yet)."""
    return path.startswith(f"{ROCKSDB}/") and not path.endswith(".sst")
