"""Salvaging a damaged RocksDB, for a start that accepts data loss (``--accept-data-loss``).

RocksDB's repair (``RepairDB``) rebuilds the MANIFEST from the table files it can read and
sets aside, in ``lost/``, every table file with a damaged block, whole: what is left is
consistent at the level of keys, not of items. An item keeps its metadata (``m...``) and its
value (``v...``) under two keys, which may have been in different files, and a table's
record (``t<name>``) in a third. So the repair is followed by a sweep that drops every half
item and every item of a table whose record was lost, so that no item is served without
its value; the write-ahead log replayed on top then brings back what it still holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import msgpack
from rocksdict import Options, Rdict

from rlreplay.app.storage.layout import table_id
from rlreplay.app.storage.rocks import RocksStore

__all__ = ["Salvage", "salvage_rocksdb"]

log = logging.getLogger(__name__)

_ID_BYTES = len(table_id(0))  # a table id's bytes after an item key's tag


@dataclass(frozen=True, slots=True)
class Salvage:
    """What a salvage set aside and dropped.

    Attributes:
        lost_files: The table files RocksDB's repair set aside (in ``<db>/lost/``).
        half_items: Items dropped because their metadata or their value was lost.
        orphaned_items: Items dropped because their table's record was lost.
    """

    lost_files: tuple[str, ...]
    half_items: int
    orphaned_items: int

    def __str__(self) -> str:
        files = ", ".join(self.lost_files) or "none"
        return (
            f"table files set aside by RocksDB's repair: {files}; items dropped: "
            f"{self.half_items} with their metadata or value lost, {self.orphaned_items} of "
            "tables whose record was lost"
        )


def salvage_rocksdb(path: Path) -> Salvage:
    """Repair the database in ``path`` and drop what the repair left half (blocking).

    Raises:
        StorageDamaged: The repaired database still does not read whole.
        OSError: RocksDB could not repair it (the message is RocksDB's).
    """
    lost = path / "lost"
    before = {p.name for p in lost.rglob("*")} if lost.exists() else set()
    try:
        Rdict.repair(str(path), Options(raw_mode=True))
    except Exception as exc:  # rocksdict raises plain Exceptions
        raise OSError(f"RocksDB could not repair {path}: {exc}") from exc
    set_aside = tuple(
        sorted(p.name for p in lost.rglob("*.sst") if p.name not in before) if lost.exists() else ()
    )
    store = RocksStore(path)  # reads every block again
    try:
        tids = {table_id(msgpack.unpackb(value, raw=False)["id"]) for _, value in store.scan(b"t")}
        metas = {key[1:] for key, _ in store.scan(b"m")}
        values = {key[1:] for key, _ in store.scan(b"v")}
        orphans = {k for k in metas | values if k[:_ID_BYTES] not in tids}
        halves = (metas ^ values) - orphans
        doomed = [b"m" + k for k in (halves | orphans) if k in metas]
        doomed += [b"v" + k for k in (halves | orphans) if k in values]
        store.write(deletes=doomed)
        store.flush()
    finally:
        store.close()
    result = Salvage(set_aside, len(halves), len(orphans))
    log.error("RocksDB in %s salvaged: %s", path, result)
    return result
