"""The backup store keeps whole snapshots only, sends each file's content once, refuses what
does not verify, and prunes without touching what a kept snapshot needs.

Every behaviour runs against a local folder, fsspec's memory filesystem and S3 (moto)."""

from __future__ import annotations

import json
import logging
import os
import posixpath
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
import xxhash

from rlreplay.app.backup import (
    STORAGE_OPTIONS_ENV,
    BackupStore,
    BackupUnavailable,
    Manifest,
    ProgressInfo,
    SnapshotCorrupt,
    SnapshotExists,
    SnapshotFile,
    SnapshotNotFound,
)
from tests.backup.conftest import BUCKET, Backend
from tests.s3server import storage_options

MB = 1 << 20


def store_for(backend: Backend, **kwargs: Any) -> BackupStore:
    """A store on ``backend`` with the smallest parts S3 allows, so 11 MB goes in parts."""
    kwargs.setdefault("part_size_mb", 5)
    return BackupStore(backend.url, storage_options=backend.options, **kwargs)


def write(folder: Path, files: dict[str, bytes]) -> Path:
    """Create ``folder`` holding ``files`` (relative path -> content)."""
    for relative, content in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return folder


def read(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``, as relative posix path -> content."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def checkpoint(seed: int = 0) -> dict[str, bytes]:
    """A RocksDB-like checkpoint: nested files, an empty one, one that takes several parts."""
    rng = bytes(range(256)) * 4
    return {
        "rocksdb/000012.sst": os.urandom(3 * MB),
        "rocksdb/000013.sst": (rng * 11 * 256)[: 11 * MB - 7] + bytes([seed]),
        "rocksdb/MANIFEST-000005": b"manifest" * 100,
        "rocksdb/CURRENT": b"MANIFEST-000005\n",
        "rocksdb/LOG.old/empty": b"",
        "memory.ckpt": f"tables {seed}".encode(),
    }


def xxh(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def test_a_snapshot_round_trips_byte_for_byte(backend: Backend, tmp_path: Path) -> None:
    files = checkpoint()
    store = store_for(backend)
    uploads: list[tuple[int, int]] = []
    result = store.upload(
        write(tmp_path / "snap", files),
        {"mode": "hybrid", "lsn": 42},
        progress=lambda done, total: uploads.append((done, total)),
    )
    total = sum(len(c) for c in files.values())
    assert (result.uploaded_bytes, result.uploaded_files, result.reused_files) == (total, 6, 0)
    assert uploads[-1] == (total, total)

    [listed] = store.list()
    assert listed == result.manifest == store.get(listed.id)
    assert listed.meta == {"mode": "hybrid", "lsn": 42}
    assert {f.path: f.size for f in listed.files} == {p: len(c) for p, c in files.items()}
    assert listed.bytes == total

    seen: list[ProgressInfo] = []
    got = store.download(listed.id, tmp_path / "restored", progress=seen.append)
    assert got == listed
    assert read(tmp_path / "restored") == files
    assert (seen[-1].files_done, seen[-1].bytes_done) == (6, total)
    assert (seen[-1].files_total, seen[-1].bytes_total, seen[-1].seconds_left) == (6, total, 0)
    assert sorted(os.listdir(tmp_path)) == ["restored", "snap"]  # no staging folder left


def test_a_second_snapshot_sends_only_new_and_changed_files(
    backend: Backend, tmp_path: Path
) -> None:
    files = checkpoint()
    store = store_for(backend)
    first = store.upload(write(tmp_path / "one", files), {})
    changed = {**files, "rocksdb/CURRENT": b"MANIFEST-000009\n", "rocksdb/000020.sst": b"n" * 999}
    second = store.upload(write(tmp_path / "two", changed), {})

    assert second.uploaded_bytes == len(b"MANIFEST-000009\n") + 999
    assert (second.uploaded_files, second.reused_files) == (2, 5)
    assert [m.id for m in store.list()] == [second.manifest.id, first.manifest.id]
    # The first snapshot still has its own CURRENT: files are addressed by content.
    store.download(first.manifest.id, tmp_path / "got-one")
    store.download(second.manifest.id, tmp_path / "got-two")
    assert read(tmp_path / "got-one") == files
    assert read(tmp_path / "got-two") == changed


def test_an_interrupted_upload_leaves_no_snapshot(backend: Backend, tmp_path: Path) -> None:
    files = checkpoint()
    folder = write(tmp_path / "snap", files)
    store = store_for(backend, concurrency=1)

    def crash(done: int, total: int) -> None:
        raise RuntimeError("killed mid-upload")

    with pytest.raises(RuntimeError, match="killed mid-upload"):
        store.upload(folder, {}, snapshot_id="crashed", progress=crash)
    assert store.list() == []
    with pytest.raises(SnapshotNotFound, match="'crashed'"):
        store.get("crashed")
    with pytest.raises(SnapshotNotFound):
        store.restore("latest", tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()

    again = store.upload(folder, {}, snapshot_id="crashed")
    assert again.reused_files >= 1  # what the crashed upload sent is not sent again
    assert again.uploaded_files + again.reused_files == len(files)
    assert [m.id for m in store.list()] == ["crashed"]
    store.download("crashed", tmp_path / "got")
    assert read(tmp_path / "got") == files


def test_a_snapshot_id_is_written_once(backend: Backend, tmp_path: Path) -> None:
    store = store_for(backend)
    store.upload(write(tmp_path / "a", {"x": b"first"}), {"n": 1}, snapshot_id="s1")
    with pytest.raises(SnapshotExists, match="'s1'"):
        store.upload(write(tmp_path / "b", {"x": b"second"}), {"n": 2}, snapshot_id="s1")
    assert store.get("s1").meta == {"n": 1}


def damage(backend: Backend, file: SnapshotFile) -> bytes:
    """Overwrite ``file``'s object with other bytes of the same size; the new bytes."""
    fs, root = backend.fs()
    bad = bytes(b ^ 0xFF for b in fs.cat_file(f"{root}/{file.object}"))
    fs.pipe_file(f"{root}/{file.object}", bad)
    return bad


def test_a_damaged_file_is_refused_naming_it_and_both_checksums(
    backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = checkpoint()
    store = store_for(backend)
    old = store.upload(write(tmp_path / "one", files), {}).manifest
    newer_files = {**files, "memory.ckpt": b"newer tables"}
    new = store.upload(write(tmp_path / "two", newer_files), {}).manifest
    [ckpt] = [f for f in new.files if f.path == "memory.ckpt"]
    bad = damage(backend, ckpt)

    with pytest.raises(SnapshotCorrupt) as refused:
        store.download(new.id, tmp_path / "dest")
    message = str(refused.value)
    assert "'memory.ckpt'" in message and ckpt.checksum in message and xxh(bad) in message
    assert sorted(os.listdir(tmp_path)) == ["one", "two"]  # nothing half-written

    caplog.set_level(logging.WARNING, logger="rlreplay.backup")
    restored = store.restore("latest", tmp_path / "dest")
    assert restored.id == old.id
    assert read(tmp_path / "dest") == files
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert new.id in warning.getMessage() and "memory.ckpt" in warning.getMessage()

    [sst] = [f for f in old.files if f.path == "rocksdb/000012.sst"]  # shared by both
    damage(backend, sst)
    with pytest.raises(SnapshotNotFound, match="2 refused as corrupt"):
        store.restore("latest", tmp_path / "other")
    with pytest.raises(SnapshotCorrupt, match=r"000012\.sst"):
        store.restore(old.id, tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_a_missing_file_makes_the_snapshot_corrupt(backend: Backend, tmp_path: Path) -> None:
    store = store_for(backend)
    manifest = store.upload(write(tmp_path / "snap", {"a/b": b"bytes"}), {}).manifest
    fs, root = backend.fs()
    fs.rm(f"{root}/{manifest.files[0].object}")
    with pytest.raises(SnapshotCorrupt, match="'a/b' is missing"):
        store.download(manifest.id, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_a_garbled_manifest_is_skipped_with_a_warning(
    backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = store_for(backend)
    good = store.upload(write(tmp_path / "snap", {"f": b"x"}), {}).manifest
    fs, root = backend.fs()
    fs.pipe_file(f"{root}/manifests/zzz.json", b'{"format": 1, "id": "zzz", "files": [')
    caplog.set_level(logging.WARNING, logger="rlreplay.backup")
    assert store.list() == [good]
    assert "zzz" in caplog.text
    with pytest.raises(SnapshotCorrupt, match="zzz"):
        store.get("zzz")


def test_download_refuses_a_folder_that_has_files(backend: Backend, tmp_path: Path) -> None:
    store = store_for(backend)
    manifest = store.upload(write(tmp_path / "snap", {"f": b"x"}), {}).manifest
    dest = write(tmp_path / "dest", {"mine": b"keep me"})
    with pytest.raises(FileExistsError, match="dest"):
        store.download(manifest.id, dest)
    assert read(dest) == {"mine": b"keep me"}
    (dest / "mine").unlink()
    store.download(manifest.id, dest)  # an empty folder is fine
    assert read(dest) == {"f": b"x"}


def test_prune_keeps_the_newest_and_every_file_they_need(backend: Backend, tmp_path: Path) -> None:
    store = store_for(backend)
    ids = []
    for i in range(4):
        files = {
            "shared.sst": b"in every snapshot",
            "era.sst": b"old era" if i < 2 else b"new era",
            "own.sst": f"only in snapshot {i}".encode(),
        }
        ids.append(store.upload(write(tmp_path / f"s{i}", files), {"i": i}).manifest.id)
    fs, root = backend.fs()
    orphan = f"files/{xxh(b'orphan')}/leftover.sst"  # as an interrupted upload leaves
    fs.makedirs(posixpath.dirname(f"{root}/{orphan}"), exist_ok=True)
    fs.pipe_file(f"{root}/{orphan}", b"orphan")
    before = {f.path + str(m.meta["i"]): f.object for m in store.list() for f in m.files}

    assert sorted(store.prune(keep=2)) == sorted(ids[:2])

    assert [m.id for m in store.list()] == [ids[3], ids[2]]
    left = {p.removeprefix(root + "/") for p in fs.find(f"{root}/files")}
    assert left == {
        before["shared.sst3"],
        before["era.sst3"],
        before["own.sst3"],
        before["own.sst2"],
    }
    assert before["era.sst0"] not in left and orphan not in left
    for i in (2, 3):
        store.download(ids[i], tmp_path / f"got{i}")
        assert read(tmp_path / f"got{i}")["own.sst"] == f"only in snapshot {i}".encode()
    assert store.prune(keep=2) == []


def test_prune_deletes_no_file_while_a_manifest_is_unreadable(
    backend: Backend, tmp_path: Path
) -> None:
    store = store_for(backend)
    ids = [
        store.upload(write(tmp_path / f"s{i}", {"f": bytes([i])}), {}).manifest.id for i in (1, 2)
    ]
    newer = store.get(ids[0]).to_json().replace(b'"format": 1', b'"format": 2')
    fs, root = backend.fs()
    fs.pipe_file(f"{root}/manifests/from-a-newer-server.json", newer)  # names the first's file
    assert store.prune(keep=1) == [ids[0]]
    assert len(fs.find(f"{root}/files")) == 2


def test_storage_options_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STORAGE_OPTIONS_ENV, raising=False)
    assert BackupStore.options_from_env() == {}
    monkeypatch.setenv(STORAGE_OPTIONS_ENV, '{"key": "k", "client_kwargs": {"region_name": "x"}}')
    assert BackupStore.options_from_env() == {"key": "k", "client_kwargs": {"region_name": "x"}}
    monkeypatch.setenv(STORAGE_OPTIONS_ENV, "{key: k}")
    with pytest.raises(ValueError, match=f"{STORAGE_OPTIONS_ENV} is not valid JSON"):
        BackupStore.options_from_env()
    monkeypatch.setenv(STORAGE_OPTIONS_ENV, '["key"]')
    with pytest.raises(ValueError, match=f"{STORAGE_OPTIONS_ENV} must be a JSON object"):
        BackupStore.options_from_env()


@pytest.mark.parametrize(
    ("url", "kwargs", "named"),
    [
        ("nope://bucket/x", {}, "'nope://bucket/x'"),
        ("", {}, "backup url"),
        ("memory://x", {"part_size_mb": 4}, r"part_size_mb \(4\)"),
        ("memory://x", {"concurrency": 0}, r"concurrency \(0\)"),
    ],
)
def test_bad_arguments_are_refused_by_name(url: str, kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        BackupStore(url, **kwargs)


def test_bad_calls_are_refused_by_name(backend: Backend, tmp_path: Path) -> None:
    store = store_for(backend)
    with pytest.raises(ValueError, match=r"keep \(0\)"):
        store.prune(keep=0)
    with pytest.raises(ValueError, match=r"'\.\./up'"):
        store.upload(write(tmp_path / "s", {"f": b"x"}), {}, snapshot_id="../up")
    with pytest.raises(ValueError, match="meta is not JSON"):
        store.upload(tmp_path / "s", {"when": object()})
    with pytest.raises(ValueError, match="is not a folder"):
        store.upload(tmp_path / "absent", {})
    assert store.list() == []


def test_a_backend_failure_is_backup_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a folder")
    store = BackupStore(f"file://{blocker}/backups")
    with pytest.raises(BackupUnavailable, match="a-file") as failed:
        store.upload(write(tmp_path / "snap", {"f": b"x"}), {})
    assert isinstance(failed.value.__cause__, OSError)


def test_an_unreachable_s3_endpoint_is_backup_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    options = storage_options(f"http://127.0.0.1:{port}")
    options["config_kwargs"] = {"retries": {"max_attempts": 1}}
    store = BackupStore(f"s3://{BUCKET}/x", storage_options=options)
    with pytest.raises(BackupUnavailable, match="s3://rlreplay-backups/x") as failed:
        store.list()
    assert "botocore" in type(failed.value.__cause__).__module__


def test_a_manifest_refuses_paths_outside_the_snapshot() -> None:
    good = Manifest(
        id="s",
        created_at=1.5,
        files=(SnapshotFile("a/b", 1, "0" * 32, "files/" + "0" * 32 + "/b"),),
        meta={"lsn": 3},
    )
    assert Manifest.from_json(good.to_json()) == good
    body = json.loads(good.to_json())
    del body["checksum"]  # a crafted manifest need not be damaged: its paths are checked too
    body["files"][0]["path"] = "../../etc/passwd"
    with pytest.raises(ValueError, match="passwd"):
        Manifest.from_json(json.dumps(body))
    with pytest.raises(ValueError, match="format 2"):
        Manifest.from_json(good.to_json().replace(b'"format": 1', b'"format": 2'))


def test_snapshot_ids_sort_by_time() -> None:
    store = BackupStore("memory://ids")
    early, late = store.new_id(1_700_000_000.001), store.new_id(1_700_000_000.002)
    assert early.startswith("20231114T221320.001Z-") and early < late


def test_a_large_file_goes_to_s3_in_parts(moto_endpoint: str, tmp_path: Path) -> None:
    backend = Backend(f"s3://{BUCKET}/{uuid.uuid4().hex}", storage_options(moto_endpoint))
    files = {"big.sst": os.urandom(11 * MB)}
    manifest = store_for(backend).upload(write(tmp_path / "snap", files), {}).manifest
    fs, root = backend.fs()
    etag = fs.info(f"{root}/{manifest.files[0].object}")["ETag"]
    assert etag.strip('"').endswith("-3")  # S3 marks a multipart object's ETag with its parts
    store_for(backend).download(manifest.id, tmp_path / "got")
    assert read(tmp_path / "got") == files


def test_a_url_nothing_was_written_to_lists_no_snapshot(tmp_path: Path) -> None:
    store = BackupStore((tmp_path / "never-written").as_uri())
    assert store.list() == []
    assert store.prune(1) == []
