"""An episode table as checkpoints keep it: in RocksDB (hybrid and disk modes) or in memory
mode's checkpoint file (and so in snapshots, which copy either).

A checkpoint writes every episode's record (length, end, final values, per-step columns,
the open tail: see :meth:`~rlreplay.app.episodes.episode_table.EpisodeTable.episode_state`)
and the sealed chunks not written before (they never change), and deletes what the
episodes deleted since held. It writes the table as the writer applied it, which may be
past the log position the checkpoint covers: replaying the log from there changes nothing
already applied (an append whose ``start`` is not its episode's length is skipped), so a
restart comes back to the same state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgpack

from rlreplay.app.episodes.episode_table import EpisodeTable
from rlreplay.app.storage.layout import (
    chunk_key,
    chunk_of,
    episode_chunks_prefix,
    episode_key,
    episode_name_of,
)

__all__ = ["episode_blobs", "load_blob", "load_rocks", "rocks_writes"]

Scan = Callable[[bytes], Iterable[tuple[bytes, bytes]]]


def episode_blobs(e: EpisodeTable) -> Iterable[bytes]:
    """Memory mode: the table's own state, then one blob per episode (its record and
    every sealed chunk), msgpack each."""
    yield msgpack.packb({"table": e.state_dict()})
    for ep in e.episodes_held():
        chunks = {f: [e.codec.stored(c) for c in ep.steps.chunks_of(f)] for f in (e.specs or {})}
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
    once they are written (the new chunks count as held). If the write fails, the caller
    keeps the deletes for the next checkpoint, which writes every record again and the
    chunks not held."""
    puts: list[tuple[bytes, Any]] = [(episode_key(prefix, ""), msgpack.packb(e.state_dict()))]
    deletes: list[bytes] = []
    gone = e.take_gone()
    fields = list(e.specs or {})
    for name, held in gone:
        if e.episode(name) is None:
            deletes.append(episode_key(prefix, name))
        deletes.extend(chunk_key(prefix, name, f, c) for f in fields for c in range(max(0, held)))
    sealed: list[tuple[Any, int]] = []
    for ep in e.episodes_held():
        puts.append((episode_key(prefix, ep.name), msgpack.packb(e.episode_state(ep))))
        n = ep.steps.sealed_chunks
        for f in fields:
            chunks = ep.steps.chunks_of(f)
            puts.extend(
                (chunk_key(prefix, ep.name, f, c), bytes(e.codec.stored(chunks[c])))
                for c in range(max(0, ep.persisted), n)
            )
        sealed.append((ep, n))

    def written() -> None:
        for ep, n in sealed:
            ep.persisted = n

    return puts, deletes, written


def load_rocks(e: EpisodeTable, prefix: bytes, scan: Scan) -> None:
    """Load the table's episodes from RocksDB (``scan``: the store's prefix scan)."""
    records: list[dict[str, Any]] = []
    for raw_key, raw in scan(episode_key(prefix, "")):
        name = episode_name_of(raw_key)
        value = msgpack.unpackb(raw, raw=False)
        if name == "" and "specs" in value:
            e.load_state_dict(value)
        else:
            records.append(value)
    for record in sorted(records, key=lambda r: int(r["created"])):
        head = episode_chunks_prefix(prefix, record["name"])
        chunks: dict[str, list[bytes]] = {}
        for raw_key, raw in scan(head):
            field, c = chunk_of(raw_key, len(head))
            got = chunks.setdefault(field, [])
            if c == len(got):
                got.append(raw)
        n = int(record["chunks"])
        e.load_episode(record, {f: got[:n] for f, got in chunks.items()})
        loaded = e.episode(record["name"])
        if loaded is not None:
            loaded.persisted = n
