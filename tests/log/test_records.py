"""Log records are named and versioned: each builder's record reads back as what it says,
and a record of another version is refused by name, not half-understood."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.log import records
from rlreplay.app.log.wal import LogRecoveryError, WriteAheadLog
from rlreplay.app.settings import Settings
from rlreplay.workers.blocking import BlockingIO


@pytest.mark.parametrize(
    ("record", "kind", "fields"),
    [
        (records.create_table("t", {"max_size": 3}), records.CREATE_TABLE, ({"max_size": 3},)),
        (records.drop_table("t"), records.DROP_TABLE, ()),
        (records.put("t", ["k"], [b"v"], [1.0], 2.5), records.PUT, (["k"], [b"v"], [1.0], 2.5)),
        (records.push_body("t", 2.5), records.PUSH_BODY, (2.5,)),
        (records.delete("t", ["k"]), records.DELETE, (["k"],)),
        (records.priorities("t", ["k"], [0.5]), records.PRIORITIES, (["k"], [0.5])),
    ],
)
def test_each_record_reads_back_as_written(record: list, kind: str, fields: tuple) -> None:
    got = records.read_record([7, *record])
    assert (got.lsn, got.kind, got.table, got.fields) == (7, kind, "t", fields)


def test_unknown_kinds_and_versions_are_named() -> None:
    with pytest.raises(ValueError, match="unknown log record kind 'putb'"):
        records.read_record([1, "putb", 1, "t", 1.0])
    newer = [1, records.DELETE, records.RECORD_VERSION + 1, "t", ["k"]]
    with pytest.raises(ValueError, match=r"'delete' record of version 2"):
        records.read_record(newer)


async def test_a_log_from_a_newer_server_is_refused_at_start(tmp_path: Path) -> None:
    data = tmp_path / "d"
    io = BlockingIO(threads=1)
    wal = WriteAheadLog(data / "wal", io=io, writer="thread")
    list(wal.replay(0))
    wal.open(0)
    await wal.commit(wal.append(records.create_table("t", {})))
    await wal.commit(wal.append([records.DELETE, records.RECORD_VERSION + 1, "t", ["k"]]))
    wal.close()
    io.close()
    eng = Engine(Settings(data_dir=data, storage_mode="memory", io_threads=2))
    with pytest.raises(LogRecoveryError, match="version 2"):
        await eng.start()
