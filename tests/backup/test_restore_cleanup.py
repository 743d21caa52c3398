"""A restore cleans up after itself: a failed or stopped download leaves nothing in the data
directory, a download a killed process left is removed at the next start (saying so), and a
snapshot whose file or manifest does not match its checksum is refused by name."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from rlreplay.app.backup import BackupStore
from rlreplay.app.backup.location import BackupLocation
from rlreplay.app.engine.engine import Engine
from rlreplay.app.engine.snapshots import RESTORING, RestoreRefused, restore_on_start
from rlreplay.app.settings import Settings

FILE_BYTES = 4 << 20


def _snapshot(store: BackupStore, tmp_path: Path, lsn: int = 7) -> str:
    """A snapshot of two files of a made-up RocksDB folder; its id."""
    folder = tmp_path / f"capture-{lsn}"
    (folder / "rocksdb").mkdir(parents=True)
    for name in ("000001.sst", "000002.sst"):
        (folder / "rocksdb" / name).write_bytes(bytes([lsn]) * FILE_BYTES)
    return store.upload(folder, {"mode": "hybrid", "lsn": lsn, "tables": {}}).manifest.id


def _settings(data_dir: Path, url: str, which: str = "latest") -> Settings:
    return Settings(data_dir=data_dir, backup_url=url, restore=which, io_threads=2)


def _leftovers(data_dir: Path) -> list[str]:
    """What a restore may leave behind: hidden folders (partial downloads, ``.restoring``)."""
    return sorted(p.name for p in data_dir.iterdir() if p.name.startswith("."))


@pytest.fixture
def slow_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Downloads read slowly (a block each 50 ms) until the event is set, so a test can
    act while one is half-way."""
    fast = threading.Event()
    real_open = BackupLocation.open_object

    class Slow:
        def __init__(self, inner: IO[bytes]) -> None:
            self._inner = inner

        def read(self, n: int = -1) -> bytes:
            if not fast.is_set():
                time.sleep(0.05)
            return self._inner.read(min(n, 256 << 10) if n > 0 else 256 << 10)

        def __enter__(self) -> Slow:
            return self

        def __exit__(self, *exc: object) -> None:
            self._inner.close()

    def open_object(self: BackupLocation, relative: str, *, block_bytes: int) -> Any:
        return Slow(real_open(self, relative, block_bytes=block_bytes))

    monkeypatch.setattr(BackupLocation, "open_object", open_object)
    yield fast
    fast.set()


def _wait_for_partial(data_dir: Path) -> Path:
    """The partial download once it holds some bytes (30 s at most)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for partial in data_dir.glob(".*.partial"):
            if any(f.is_file() and f.stat().st_size for f in partial.rglob("*")):
                return partial
        time.sleep(0.01)
    raise AssertionError(f"no partial download appeared in {data_dir}")


def test_a_stale_partial_download_is_removed_at_the_next_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    partial = data / f".{RESTORING}.0badc0de.partial" / "rocksdb"
    partial.mkdir(parents=True)
    (partial / "000001.sst").write_bytes(bytes(1 << 20))
    whole_not_moved = data / RESTORING / "rocksdb"
    whole_not_moved.mkdir(parents=True)
    (whole_not_moved / "CURRENT").write_text("MANIFEST-000001\n")
    (data / "wal").mkdir()
    with caplog.at_level(logging.WARNING):
        # a start without --restore cleans up too: the flag may be gone since
        assert restore_on_start(Settings(data_dir=data)) is None
    assert _leftovers(data) == []
    assert (data / "wal").is_dir()  # only what a restore left goes
    logged = caplog.text
    assert f".{RESTORING}.0badc0de.partial" in logged and "1.0 MB" in logged
    assert str(data / RESTORING) in logged


def test_a_stopped_download_removes_what_it_downloaded(
    tmp_path: Path, slow_reads: threading.Event
) -> None:
    store = BackupStore(f"file://{tmp_path / 'backups'}")
    _snapshot(store, tmp_path)
    data = tmp_path / "data"
    stop = threading.Event()
    failures: list[BaseException] = []

    def restore() -> None:
        try:
            restore_on_start(_settings(data, store.url), None, stop)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=restore)
    thread.start()
    _wait_for_partial(data)
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    assert len(failures) == 1 and isinstance(failures[0], RestoreRefused), failures
    assert "stopped" in str(failures[0])
    assert _leftovers(data) == []
    assert not (data / "rocksdb").exists()


async def test_a_start_cancelled_during_its_restore_stops_it_and_cleans_up(
    tmp_path: Path, slow_reads: threading.Event
) -> None:
    """What SIGTERM does to ``rlreplay serve`` while it restores: the lifespan cancels the
    start, and the download in its thread stops at its next block and is removed."""
    store = BackupStore(f"file://{tmp_path / 'backups'}")
    _snapshot(store, tmp_path)
    data = tmp_path / "data"
    engine = Engine(_settings(data, store.url))
    start = asyncio.create_task(engine.start())
    await asyncio.to_thread(_wait_for_partial, data)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert _leftovers(data) == []
    # the download stopped: a restore that went on would have put its files in place
    assert not (data / "rocksdb").exists()


def test_a_file_that_does_not_match_its_checksum_is_refused_by_name(tmp_path: Path) -> None:
    backups = tmp_path / "backups"
    store = BackupStore(f"file://{backups}")
    snapshot = _snapshot(store, tmp_path)
    damaged = next(backups.glob("files/*/000002.sst"))
    with damaged.open("r+b") as f:
        f.seek(FILE_BYTES // 2)
        f.write(b"\xff")
    data = tmp_path / "data"
    with pytest.raises(RestoreRefused) as refused:
        restore_on_start(_settings(data, store.url, snapshot))
    message = str(refused.value)
    assert "rocksdb/000002.sst" in message
    assert damaged.parent.name in message  # the checksum the manifest recorded
    assert message.count("checksum") >= 2  # and the one the download found
    assert _leftovers(data) == [] and not (data / "rocksdb").exists()


def test_a_damaged_manifest_is_refused_by_name_and_latest_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backups = tmp_path / "backups"
    store = BackupStore(f"file://{backups}")
    older = _snapshot(store, tmp_path, lsn=7)
    newer = _snapshot(store, tmp_path, lsn=9)
    manifest = backups / "manifests" / f"{newer}.json"
    text = manifest.read_text()
    assert '"lsn": 9' in text
    manifest.write_text(text.replace('"lsn": 9', '"lsn": 8'))  # one digit off
    data = tmp_path / "data"
    with pytest.raises(RestoreRefused, match=newer) as refused:
        restore_on_start(_settings(data, store.url, newer))
    assert "checksum" in str(refused.value)
    assert _leftovers(data) == []
    with caplog.at_level(logging.WARNING):
        restored = restore_on_start(_settings(data, store.url))
    assert restored is not None and restored.id == older
    assert newer in caplog.text
    assert (data / "rocksdb" / "000001.sst").read_bytes() == bytes([7]) * FILE_BYTES
