"""A start refused on a damaged RocksDB says so in one line: the storage does not log the
damage that its opening raises (the start's refusal names it), while damage met once the
database is open is logged where it is met, naming the file."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlreplay.app.storage.faults import StorageDamaged
from rlreplay.app.storage.rocks import RocksStore


def _flip(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def _damaged_db(path: Path) -> Path:
    """A database of one table file, a byte of a data block flipped; that file."""
    store = RocksStore(path)
    store.write([(b"m%06d" % i, bytes(1000)) for i in range(3000)])
    store.flush()
    store.close()
    sst = max(path.glob("*.sst"), key=lambda p: p.stat().st_size)
    _flip(sst, sst.stat().st_size // 2)
    return sst


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("damage", ["data-block", "current"])
def test_damage_found_while_opening_is_raised_not_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    sst = _damaged_db(tmp_path / "db")
    if damage == "current":
        _flip(tmp_path / "db" / "CURRENT", 2)
    with caplog.at_level(logging.INFO), pytest.raises(StorageDamaged) as raised:
        RocksStore(tmp_path / "db")
    named = "CURRENT" if damage == "current" else sst.name
    assert named in str(raised.value)
    assert _errors(caplog) == []


def test_damage_met_once_open_is_logged_naming_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sst = _damaged_db(tmp_path / "db")
    store = RocksStore(tmp_path / "db", verify=False)  # as a store opened before the damage
    try:
        with caplog.at_level(logging.INFO), pytest.raises(StorageDamaged):
            sum(1 for _ in store.scan(b"m"))
    finally:
        store.close()
    errors = _errors(caplog)
    assert len(errors) == 1 and sst.name in errors[0], errors
