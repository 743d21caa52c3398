"""How rlreplay lays its state out in RocksDB: every key and every encoding, in one place.

==========================  ================================================================
key                         value
==========================  ================================================================
``\\x00lsn``                 the log position the last checkpoint covers (8 bytes, big-endian)
``\\x00next_tid``            the next table id (8 bytes, big-endian)
``t`` + table name          the table's ``state_dict()`` (msgpack): id, config, counts
``v`` + table id + key      an item's value, the msgpack bytes as pushed
``m`` + table id + key      an item's metadata: :data:`META` (priority, inserted_at,
                            times_sampled, size, insertion order), then the fields a plugin
                            sampler indexes (msgpack), if it indexes any, then its rollout
                            metadata (msgpack ``[group, version, field names, names of
                            the tasks that acknowledged it]``), if it has any
``\\x00id:`` + request id   an answered request id of the idempotency window: msgpack
                            ``[at, kind, body]`` (:func:`request_id_puts`)
``\\x00request_ids``        the whole window in one value, as earlier versions wrote it
                            (msgpack ``[[id, at, kind, body], ...]``): read, then replaced
                            by the keys above at the next checkpoint
``\\x00replay_bytes_s``      the log replay rate the last start measured (a little-endian
                            double: :func:`pack_rate`), where one has
``e`` + table id            an episode table's own state (msgpack: its fields, chunk length,
                            counters)
``e`` + table id + name     an episode's record (msgpack: length, end, final values, per-step
                            priority, append order and times sampled, its open tail)
``c`` + table id + u64      a sealed chunk of an episode's steps: one field's values for a
episode number + u16 field  run of steps, compressed when the table says so (the number:
length + field + u32 chunk  the episode's ``created``, never reused, unlike its name)
==========================  ================================================================

A table id is 4 big-endian bytes, so a table's values (and its metadata) are one key range.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np

LSN_KEY = b"\x00lsn"
NEXT_TID_KEY = b"\x00next_tid"
REQUEST_IDS_KEY = b"\x00request_ids"
REPLAY_RATE_KEY = b"\x00replay_bytes_s"
#: The keys of the idempotency window's ids, one per id, and the range they make up.
REQUEST_ID_PREFIX = b"\x00id:"
REQUEST_ID_RANGE = (REQUEST_ID_PREFIX, b"\x00id;")
META = struct.Struct("<ddIIQ")
#: :data:`META` as a NumPy record, to pack many records at once (:func:`pack_metas`).
META_ROW = np.dtype(
    [
        ("priority", "<f8"),
        ("inserted_at", "<f8"),
        ("times_sampled", "<u4"),
        ("size", "<u4"),
        ("order", "<u8"),
    ]
)
assert META_ROW.itemsize == META.size


def table_id(tid: int) -> bytes:
    """The 4 bytes that name table ``tid`` in its items' keys."""
    return tid.to_bytes(4, "big")


def table_key(name: str) -> bytes:
    """The key of a table's own record."""
    return b"t" + name.encode()


def value_key(table_prefix: bytes, key: str) -> bytes:
    """The key of an item's value (``table_prefix``: :func:`table_id` of its table)."""
    return b"v" + table_prefix + key.encode()


def meta_key(table_prefix: bytes, key: str) -> bytes:
    """The key of an item's metadata."""
    return b"m" + table_prefix + key.encode()


def value_keys(table_prefix: bytes, keys: list[str]) -> list[bytes]:
    """:func:`value_key` of each of ``keys``."""
    prefix = b"v" + table_prefix
    return [prefix + key.encode() for key in keys]


def meta_keys(table_prefix: bytes, keys: list[str]) -> list[bytes]:
    """:func:`meta_key` of each of ``keys``."""
    prefix = b"m" + table_prefix
    return [prefix + key.encode() for key in keys]


def item_key_of(raw_key: bytes) -> str:
    """The item key of a value or metadata key."""
    return raw_key[5:].decode()


def table_ranges(tid: int) -> list[tuple[bytes, bytes]]:
    """The key ranges holding every value and metadata record of table ``tid``, and its
    episodes' records and chunks."""
    return [(tag + table_id(tid), tag + table_id(tid + 1)) for tag in (b"v", b"m", b"e", b"c")]


def episode_key(table_prefix: bytes, name: str) -> bytes:
    """The key of an episode's record (``name`` empty: the episode table's own state)."""
    return b"e" + table_prefix + name.encode()


def episode_name_of(raw_key: bytes) -> str:
    """The episode name of an episode record's key (empty: the table's own state)."""
    return raw_key[5:].decode()


def chunk_key(table_prefix: bytes, created: int, field: str, chunk: int) -> bytes:
    """The key of sealed chunk ``chunk`` of field ``field`` of the episode numbered
    ``created`` in its table."""
    field_bytes = field.encode()
    return (
        episode_chunks_prefix(table_prefix, created)
        + len(field_bytes).to_bytes(2, "big")
        + field_bytes
        + chunk.to_bytes(4, "big")
    )


def episode_chunks_prefix(table_prefix: bytes, created: int) -> bytes:
    """The prefix of every chunk key of the episode numbered ``created``."""
    return b"c" + table_prefix + created.to_bytes(8, "big")


def chunk_of(raw_key: bytes, prefix_len: int) -> tuple[str, int]:
    """(field, chunk number) of a chunk key whose episode prefix is ``prefix_len`` long."""
    n = int.from_bytes(raw_key[prefix_len : prefix_len + 2], "big")
    field = raw_key[prefix_len + 2 : prefix_len + 2 + n].decode()
    return field, int.from_bytes(raw_key[prefix_len + 2 + n :], "big")


def pack_meta(
    priority: float,
    inserted_at: float,
    times_sampled: int,
    size: int,
    order: int,
    fields: dict[str, Any] | None,
    rollout: list[Any] | None = None,
) -> bytes:
    """An item's metadata record (``fields``: None when the table indexes none;
    ``rollout``: None when the item has no rollout metadata)."""
    head = META.pack(priority, inserted_at, times_sampled, size, order)
    if fields is None and rollout is None:
        return head
    return head + pack_meta_extra(fields, rollout)


def pack_meta_extra(fields: dict[str, Any] | None, rollout: list[Any] | None) -> bytes:
    """What follows :data:`META` in a record (see :func:`pack_meta`): nothing when both
    are None."""
    if fields is None and rollout is None:
        return b""
    extra: bytes = msgpack.packb(fields or {}, use_bin_type=True)
    if rollout is not None:
        extra += msgpack.packb(rollout, use_bin_type=True)
    return extra


def pack_metas(
    priority: np.ndarray,
    inserted_at: np.ndarray,
    times_sampled: np.ndarray,
    size: np.ndarray,
    order: np.ndarray,
    extras: list[bytes] | None = None,
) -> list[bytes]:
    """The records of many items at once (the columns of :func:`pack_meta`, one entry per
    item; ``extras``: each one's :func:`pack_meta_extra`, None when all are empty): the
    same bytes as :func:`pack_meta` gives each, built in one NumPy pass."""
    rows = np.empty(len(priority), dtype=META_ROW)
    rows["priority"] = priority
    rows["inserted_at"] = inserted_at
    rows["times_sampled"] = times_sampled
    rows["size"] = size
    rows["order"] = order
    raw = rows.tobytes()
    width = META.size
    heads = [raw[at : at + width] for at in range(0, len(raw), width)]
    if extras is None:
        return heads
    return [head + extra for head, extra in zip(heads, extras, strict=True)]


def unpack_meta(
    raw: bytes,
) -> tuple[float, float, int, int, int, dict[str, Any], list[Any] | None]:
    """(priority, inserted_at, times_sampled, size, order, indexed fields, rollout
    metadata or None) of a record."""
    priority, inserted_at, times_sampled, size, order = META.unpack_from(raw)
    fields: dict[str, Any] = {}
    rollout: list[Any] | None = None
    if len(raw) > META.size:
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(raw[META.size :])
        parts = list(unpacker)
        fields = parts[0]
        rollout = parts[1] if len(parts) > 1 else None
    return priority, inserted_at, times_sampled, size, order, fields, rollout


def pack_rate(rate: float) -> bytes:
    """A replay rate as stored."""
    return struct.pack("<d", rate)


def unpack_rate(raw: bytes | None) -> float:
    """A stored replay rate, 0.0 where none is stored."""
    return float(struct.unpack("<d", raw)[0]) if raw else 0.0


def request_id_keys(ids: list[str]) -> list[bytes]:
    """The keys of the window's ``ids`` (any string: a lone surrogate too)."""
    prefix = REQUEST_ID_PREFIX
    return [prefix + rid.encode("utf-8", "surrogatepass") for rid in ids]


def request_id_puts(rows: list[tuple[str, float, str, Any]]) -> list[tuple[bytes, bytes]]:
    """The RocksDB puts of the window's rows ``(id, at, kind, body)``."""
    pack = msgpack.Packer().pack
    prefix = REQUEST_ID_PREFIX
    return [
        (prefix + rid.encode("utf-8", "surrogatepass"), pack((at, kind, body)))
        for rid, at, kind, body in rows
    ]


def request_id_row(raw_key: bytes, raw: bytes) -> tuple[str, float, str, Any]:
    """A row of the window from its key and value (:func:`request_id_puts`)."""
    at, kind, body = msgpack.unpackb(raw, raw=False)
    rid = raw_key[len(REQUEST_ID_PREFIX) :].decode("utf-8", "surrogatepass")
    return rid, float(at), kind, body


def pack_count(n: int) -> bytes:
    """A log position or table id as stored."""
    return n.to_bytes(8, "big")


def unpack_count(raw: bytes | None, default: int) -> int:
    """A stored count, or ``default`` where none is stored."""
    return int.from_bytes(raw, "big") if raw else default
