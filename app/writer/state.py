"""What the engine's parts share: storage handles, the tables, the cache ledger, the log."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgpack
import numpy as np

from rlreplay.app.episodes.chunk_residency import ChunkResidency
from rlreplay.app.log.data_loss import DataLoss
from rlreplay.app.log.wal import WriteAheadLog
from rlreplay.app.settings import Settings
from rlreplay.app.storage.cache import ENTRY_OVERHEAD, CacheLedger
from rlreplay.app.storage.layout import pack_meta, pack_meta_extra, pack_metas
from rlreplay.app.storage.rocks import RocksStore
from rlreplay.app.tables.stats import TableCounters
from rlreplay.app.tables.table import Table
from rlreplay.app.writer.request_ids import RequestIds
from rlreplay.workers.blocking import BlockingIO

if TYPE_CHECKING:
    from rlreplay.app.writer.storage import Storage


@dataclass(slots=True)
class EngineState:
    """The engine's shared state. Readers read it; the writer changes which tables and
    keys exist and where values live; admissions and samples change a table through its
    own methods (see :class:`~rlreplay.app.tables.table.Table`)."""

    settings: Settings
    io: BlockingIO
    ledger: CacheLedger[Table | ChunkResidency]
    #: The storage mode's object (:mod:`rlreplay.app.writer.storage`), chosen once at start.
    storage: Storage
    wal: WriteAheadLog | None = None
    tables: dict[str, Table] = field(default_factory=dict)
    #: The counters of the tables dropped since start, summed (for the metrics' totals).
    dropped_counters: TableCounters = field(default_factory=TableCounters)
    next_tid: int = 1
    #: The last op sequence number handed out (the WAL's LSN when the log is on): by
    #: :meth:`rlreplay.app.engine.core.EngineCore.admit`, where a write is admitted.
    seq: int = 0
    queued_items: int = 0
    queued_bytes: int = 0
    #: The idempotency window of writes' request ids (saved with every checkpoint).
    request_ids: RequestIds = field(default_factory=RequestIds)
    #: What recovery may go past (missing or damaged data), and what it went past.
    data_loss: DataLoss = field(default_factory=DataLoss)

    @property
    def mode(self) -> str:
        """memory, disk or hybrid."""
        return self.storage.mode

    @property
    def store(self) -> RocksStore | None:
        """RocksDB, open (None in memory mode, and before recovery opens it)."""
        return self.storage.store


def meta_bytes(table: Table, slot: int) -> bytes:
    """The metadata record of a slot (see :mod:`rlreplay.app.storage.layout`)."""
    return pack_meta(
        float(table.priority[slot]),
        float(table.inserted_at[slot]),
        int(table.times_sampled[slot]),
        int(table.size[slot]),
        int(table.order[slot]),
        table.fields.get(slot, {}) if table.index_fields else None,
        table.rollouts.meta_of(slot),
    )


def meta_records(table: Table, slots: np.ndarray) -> list[bytes]:
    """:func:`meta_bytes` of each of ``slots`` (distinct), built from the table's columns
    at once: a checkpoint's step packs thousands."""
    rollouts = table.rollouts.metas_of(slots)
    extras: list[bytes] | None = None
    if table.index_fields or rollouts is not None:
        fields = table.fields if table.index_fields else None
        slot_list = slots.tolist()
        extras = [
            pack_meta_extra(
                fields.get(slot, {}) if fields is not None else None,
                rollouts[i] if rollouts is not None else None,
            )
            for i, slot in enumerate(slot_list)
        ]
    return pack_metas(
        table.priority[slots],
        table.inserted_at[slots],
        table.times_sampled[slots],
        table.size[slots],
        table.order[slots],
        extras,
    )


def table_record(table: Table) -> bytes:
    """The RocksDB value describing a table: its :meth:`~Table.state_dict`."""
    record: bytes = msgpack.packb(table.state_dict())
    return record


def cache_charge(size: int) -> int:
    """Bytes charged to the cache for an entry whose key and value take ``size`` bytes."""
    return size + ENTRY_OVERHEAD
