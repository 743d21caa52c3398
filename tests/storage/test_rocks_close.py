"""Closing a RocksDB store lets go of the folder's lock, and runs a full garbage collection
only when something in a reference cycle still holds the database."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlreplay.app.storage.rocks import RocksStore, lock_still_open


@pytest.fixture
def full_collections() -> Iterator[list[int]]:
    """The generation-2 collections started while the test runs (one entry each)."""
    seen: list[int] = []

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            seen.append(2)

    gc.callbacks.append(count)
    try:
        yield seen
    finally:
        gc.callbacks.remove(count)


def test_a_plain_close_frees_the_lock_without_a_full_collection(
    tmp_path: Path, full_collections: list[int]
) -> None:
    store = RocksStore(tmp_path / "db")
    store.write([(b"k", b"v")])
    was_enabled = gc.isenabled()
    gc.disable()  # only the store's own calls may collect
    try:
        store.close()
    finally:
        if was_enabled:
            gc.enable()
    assert full_collections == []
    assert not lock_still_open(tmp_path / "db" / "LOCK")
    again = RocksStore(tmp_path / "db")
    assert again.get(b"k") == b"v"
    again.close()


def test_a_handle_held_by_a_reference_cycle_still_frees_the_lock(
    tmp_path: Path, full_collections: list[int]
) -> None:
    store = RocksStore(tmp_path / "db")
    store.write([(b"k", b"v")])
    cycle: list[Any] = [store._live().iter()]  # an iterator holds the database open
    cycle.append(cycle)
    del cycle
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        assert lock_still_open(tmp_path / "db" / "LOCK")
        store.close()
    finally:
        if was_enabled:
            gc.enable()
    assert full_collections != []
    assert not lock_still_open(tmp_path / "db" / "LOCK")
    again = RocksStore(tmp_path / "db")  # the lock is free in this process too
    assert again.get(b"k") == b"v"
    again.close()


def test_a_lock_file_nobody_opened_is_not_open(tmp_path: Path) -> None:
    (tmp_path / "LOCK").touch()
    assert not lock_still_open(tmp_path / "LOCK")
    with (tmp_path / "LOCK").open() as held:
        assert held.readable()
        assert lock_still_open(tmp_path / "LOCK")
