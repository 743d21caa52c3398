"""An episode table as checkpoints keep it: in RocksDB (hybrid and disk modes) or in memory
mode's checkpoint file (and so in snapshots, which copy either).

A RocksDB checkpoint writes the records of the episodes changed since the last one that
was written (length, end, final values, per-step columns, the open tail: see
:meth:`~rlreplay.app.episodes.episode_table.EpisodeTable.episode_state`) and their sealed
chunks RocksDB does not hold yet (they never change; an eviction may have written some
already), and deletes what the episodes deleted since held. It writes the table as the
writer applied it, which may be past the log position the checkpoint covers: replaying the
log from there changes nothing already applied (an append whose ``start`` is not its
episode's length is skipped), so a restart comes back to the same state. A start loads the
records and leaves the chunks in RocksDB, read back when a read needs them. Memory mode
writes every episode and every chunk each time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import msgpack

from rlreplay.app.episodes.episode import Episode
from rlreplay.app.episodes.episode_table import EpisodeTable
from rlreplay.app.storage.layout import (
    chunk_key,
    chunk_of,
    episode_chunks_prefix,
    episode_key,
    episode_name_of,
)

__all__ = ["episode_blobs", "load_blob", "load_rocks", "rocks_writes"]


class Store(Protocol):
    """What loading needs of the RocksDB store: prefix scans, and reads by key later."""

    def scan(self, prefix: bytes) -> Iterable[tuple[bytes, bytes]]: ...

    def get_many(self, keys: list[bytes]) -> list[bytes | None]: ...


def episode_blobs(e: EpisodeTable) -> Iterable[bytes]:
    """Memory mode: the table's own state, then one blob per episode (its record and
    every sealed chunk), msgpack each."""
    yield msgpack.packb({"table": e.state_dict()})
    for ep in e.episodes_held():
        chunks = {
            f: [e.codec.stored(c) for c in ep.steps.chunks_of(f) if c is not None]
            for f in (e.specs or {})
        }
        yield msgpack.packb({"record": e.episode_state(ep), "chunks": chunks})


def load_blob(e: EpisodeTable, blob: bytes) -> None:
    """Take back one blob of :func:`episode_blobs` (the table's state comes first)."""
    value = msgpack.unpackb(blob, raw=False)
    if "table" in value:
        e.load_state_dict(value["table"])
    else:
        e.load_episode(value["record"], value["chunks"])


def rocks_writes(
    e: EpisodeTable, prefix: bytes
) -> tuple[list[tuple[bytes, Any]], list[bytes], Callable[[], None]]:
    """RocksDB modes: the puts and deletes of a checkpoint of the table, and what to call
    once they are written. If the write fails, the caller keeps the deletes for the next
    checkpoint, which writes the records of every episode changed since the last written
    one and the chunks RocksDB does not hold."""
    e.residency.prefix = prefix
    puts: list[tuple[bytes, Any]] = [(episode_key(prefix, ""), msgpack.packb(e.state_dict()))]
    deletes: list[bytes] = []
    fields = list(e.specs or {})
    for name, created, chunks in e.take_gone():
        if e.episode(name) is None:
            deletes.append(episode_key(prefix, name))
        deletes.extend(chunk_key(prefix, created, f, c) for f in fields for c in range(chunks))
    changed, upto = e.changed()
    stored: list[tuple[Episode, list[int], int]] = []
    for ep in changed:
        puts.append((episode_key(prefix, ep.name), msgpack.packb(e.episode_state(ep))))
        new = ep.steps.unstored()
        for c in new:
            puts.extend(ep.steps.store_puts(c))
        stored.append((ep, new, ep.steps.sealed_chunks))

    def written() -> None:
        e.written(upto)
        for ep, new, n in stored:
            ep.steps.mark_stored(new)
            ep.persisted = n

    return puts, deletes, written


def load_rocks(e: EpisodeTable, prefix: bytes, store: Store) -> None:
    """Load the table's episodes from RocksDB: their records; their chunks stay there."""
    e.residency.store, e.residency.prefix = store, prefix
    records: list[dict[str, Any]] = []
    for raw_key, raw in store.scan(episode_key(prefix, "")):
        name = episode_name_of(raw_key)
        value = msgpack.unpackb(raw, raw=False)
        if name == "" and "specs" in value:
            e.load_state_dict(value)
        else:
            records.append(value)
    for record in sorted(records, key=lambda r: int(r["created"])):
        head = episode_chunks_prefix(prefix, int(record["created"]))
        sizes: dict[str, list[bytes | int]] = {}
        for raw_key, raw in store.scan(head):
            field, c = chunk_of(raw_key, len(head))
            got = sizes.setdefault(field, [])
            if c == len(got):
                got.append(len(raw))
        n = int(record["chunks"])
        e.load_episode(record, {f: got[:n] for f, got in sizes.items()})
        loaded = e.episode(record["name"])
        if loaded is not None:
            loaded.persisted = n
