"""``rlreplay export``: a table of a data directory or snapshot, out as JSON Lines or Parquet."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import shutil
from pathlib import Path
from typing import Any, Literal

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rocksdict import Options, Rdict, SstFileWriter

from rlreplay.app.backup import BackupStore
from rlreplay.app.engine.engine import Engine
from rlreplay.app.export import add_export_parser, export_snapshot, export_table, run_export
from rlreplay.app.storage.layout import table_ranges
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.wire.codec import packb
from rlreplay.wire.errors import TableNotFound, ValidationFailed
from tests.engine.conftest import make_settings

MODES = ["hybrid", "memory"]
N = 2500  # more than two read batches and more than one push


def value_of(i: int) -> dict[str, Any]:
    return {
        "reward": 0.25 * i,
        "step": i,
        "name": f"ep{i}",
        "obs": np.arange(4, dtype=np.float32) + i / 8,
        "img": (np.arange(6, dtype=np.uint8) + i % 200).reshape(3, 2),
    }


def build(data_dir: Path, mode: str, tables: dict[str, list[NewItem]]) -> None:
    """A data directory written by an engine in ``mode`` holding ``tables``, then stopped."""

    async def run() -> None:
        # memory mode keeps a checkpoint only with the log on; a tiny cache puts hybrid's
        # values in RocksDB
        limit = 0.05 if mode == "hybrid" else 64
        engine = Engine(make_settings(data_dir, storage_mode=mode, cache_memory_limit_mb=limit))
        await engine.start()
        try:
            for name, items in tables.items():
                await engine.create_table(name, TableConfig())
                for start in range(0, len(items), 1000):
                    await engine.push(name, items[start : start + 1000], wait=True)
        finally:
            await engine.stop()

    asyncio.run(run())


@pytest.fixture(scope="module", params=MODES)
def data_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp(f"data-{request.param}")
    build(
        path,
        request.param,
        {
            "steps": [NewItem(f"k{i}", packb(value_of(i)), 1.0 + i / 10) for i in range(N)],
            "other": [NewItem("only", packb([1, "two", None]), 3.0)],
        },
    )
    return path


def mode_of(data_dir: Path) -> str:
    return "memory" if (data_dir / "memory.ckpt").exists() else "hybrid"


def copy(data_dir: Path, dest: Path) -> Path:
    """The engine's stop checkpoints into the directory it reads: each export gets a copy."""
    shutil.copytree(data_dir, dest)
    return dest


def test_jsonl_holds_every_item_in_insertion_order(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "steps.jsonl"
    rows = export_table(
        copy(data_dir, tmp_path / "d"), "steps", "jsonl", out, mode=mode_of(data_dir)
    )
    assert rows == N
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["key"] for r in lines] == [f"k{i}" for i in range(N)]
    for i, r in enumerate(lines):
        v = value_of(i)
        assert r["priority"] == 1.0 + i / 10
        assert r["times_sampled"] == 0 and r["inserted_at"] > 0
        assert (r["reward"], r["step"], r["name"]) == (v["reward"], v["step"], v["name"])
        np.testing.assert_array_equal(np.array(r["obs"], dtype=np.float32), v["obs"])
        np.testing.assert_array_equal(np.array(r["img"], dtype=np.uint8), v["img"])


def test_parquet_holds_every_item_and_array_shapes(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "steps.parquet"
    rows = export_table(
        copy(data_dir, tmp_path / "d"), "steps", "parquet", out, mode=mode_of(data_dir)
    )
    assert rows == N
    table = pq.read_table(out)
    assert table.schema.field("obs").type == pa.list_(pa.float32())
    assert table.schema.field("img").type == pa.list_(pa.uint8())
    assert "obs.shape" not in table.schema.names  # 1-D arrays need no shape
    got = table.to_pylist()
    assert [r["key"] for r in got] == [f"k{i}" for i in range(N)]
    for i, r in enumerate(got):
        v = value_of(i)
        assert r["priority"] == 1.0 + i / 10
        assert (r["reward"], r["step"], r["name"]) == (v["reward"], v["step"], v["name"])
        np.testing.assert_array_equal(np.array(r["obs"], dtype=np.float32), v["obs"])
        img = np.reshape(np.array(r["img"], dtype=np.uint8), r["img.shape"])
        np.testing.assert_array_equal(img, v["img"])


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_value_that_is_not_a_map_is_one_value_column(
    data_dir: Path, tmp_path: Path, fmt: Literal["jsonl", "parquet"]
) -> None:
    out = tmp_path / f"other.{fmt}"
    d = copy(data_dir, tmp_path / "d")
    assert export_table(d, "other", fmt, out, mode=mode_of(data_dir)) == 1
    if fmt == "jsonl":
        (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    else:
        (row,) = pq.read_table(out).to_pylist()
    assert row["key"] == "only" and row["priority"] == 3.0
    value = row["value"] if fmt == "jsonl" else json.loads(row["value"])
    assert value == [1, "two", None]


def test_an_unknown_table_is_named_with_the_tables_there(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    with pytest.raises(TableNotFound, match=r"'nope'.*other, steps"):
        export_table(copy(data_dir, tmp_path / "d"), "nope", "jsonl", out, mode=mode_of(data_dir))
    assert not out.exists()


def test_jsonl_spells_floats_json_cannot_and_bytes_as_base64(tmp_path: Path) -> None:
    values = [
        {"x": float("nan"), "y": float("inf"), "z": -float("inf"), "b": b"\x00\xff"},
        {"x": 1.5, "y": np.array([np.nan, 2.0]), "z": 0.0, "b": b""},
    ]
    items = [NewItem(f"k{i}", packb(v)) for i, v in enumerate(values)]
    build(tmp_path / "d", "hybrid", {"t": items})
    out = tmp_path / "t.jsonl"
    export_table(tmp_path / "d", "t", "jsonl", out, mode="hybrid")
    text = out.read_text()
    first, second = (json.loads(line) for line in text.splitlines())
    assert first == {
        **first,
        "x": "NaN",
        "y": "Infinity",
        "z": "-Infinity",
        "b": base64.b64encode(b"\x00\xff").decode(),
    }
    assert second["y"] == ["NaN", 2.0]
    assert "NaN," not in text.replace('"NaN",', "")  # no bare NaN token anywhere


def test_parquet_refuses_a_value_that_does_not_fit_the_first_batch(tmp_path: Path) -> None:
    items = [NewItem(f"k{i}", packb({"x": i})) for i in range(1100)]
    items.append(NewItem("late", packb({"x": "a string"})))
    build(tmp_path / "d", "hybrid", {"t": items})
    out = tmp_path / "t.parquet"
    with pytest.raises(ValidationFailed, match=r"column 'x'.*'late'"):
        export_table(tmp_path / "d", "t", "parquet", out, mode="hybrid")
    assert not out.exists() and list(tmp_path.glob("*.partial")) == []  # no half file


def test_an_empty_table_gives_a_parquet_file_of_the_item_columns(tmp_path: Path) -> None:
    build(tmp_path / "d", "memory", {"t": []})
    out = tmp_path / "t.parquet"
    assert export_table(tmp_path / "d", "t", "parquet", out, mode="memory") == 0
    assert pq.read_table(out).schema.names == ["key", "priority", "inserted_at", "times_sampled"]


def test_export_snapshot_and_the_command_read_a_backup(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    mode = mode_of(data_dir)
    snap = tmp_path / "snap"  # what a server's snapshot holds: no log
    snap.mkdir()
    name = "memory.ckpt" if mode == "memory" else "rocksdb"
    (shutil.copy2 if mode == "memory" else shutil.copytree)(data_dir / name, snap / name)
    url = (tmp_path / "backups").as_uri()
    store = BackupStore(url)
    old = store.upload(snap, {"mode": mode, "tables": {}}).manifest
    build(tmp_path / "newer", mode, {"other": []})  # a newer snapshot without "steps"
    newer = tmp_path / "newer-snap"
    newer.mkdir()
    (shutil.copy2 if mode == "memory" else shutil.copytree)(tmp_path / "newer" / name, newer / name)
    store.upload(newer, {"mode": mode, "tables": {}})

    out = tmp_path / "a.jsonl"
    with pytest.raises(TableNotFound):
        export_snapshot(url, "steps", "jsonl", out)  # "latest" is the newer one
    assert export_snapshot(url, "steps", "jsonl", out, snapshot=old.id) == N
    assert len(out.read_text().splitlines()) == N

    monkeypatch.delenv("RLREPLAY_BACKUP_STORAGE_OPTIONS", raising=False)
    parser = argparse.ArgumentParser(prog="rlreplay")
    add_export_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "b.parquet"
    argv = ["export", url, "--table", "steps", "--format", "parquet", "--snapshot", old.id]
    assert run_export(parser.parse_args([*argv, str(out)])) == 0
    assert pq.read_table(out).num_rows == N
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == f"exported {N} rows of table 'steps' from snapshot {old.id} to {out}"
    assert lines[0].startswith("rlreplay export: ")
    done = f"rlreplay export: writing: done, {N:,} rows in "
    assert any(x.startswith(done) for x in lines), lines  # not a terminal: lines, no bar
    assert run_export(parser.parse_args([*argv[:-1], "nope", str(out)])) == 1
    assert "rlreplay export: error:" in capsys.readouterr().err


def small_files(source: Path, dest: Path, scratch: Path) -> list[dict[str, Any]]:
    """``source``'s keys in a new RocksDB at ``dest`` made of files of 50 keys each, as a
    big database's files each hold a narrow key range; their ``live_files()``."""
    db = Rdict(str(source), Options(raw_mode=True))
    items = list(db.items())
    db.close()
    scratch.mkdir()
    paths = []
    for start in range(0, len(items), 50):
        writer = SstFileWriter(Options(raw_mode=True))
        paths.append(str(scratch / f"{start}.sst"))
        writer.open(paths[-1])
        for key, value in items[start : start + 50]:
            writer[key] = value
        writer.finish()
    db = Rdict(str(dest), Options(raw_mode=True))
    db.ingest_external_file(paths)
    files: list[dict[str, Any]] = db.live_files()
    db.close()
    return files


def test_a_table_of_a_rocksdb_snapshot_is_read_from_its_own_files_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """Export fetches the files that hold its table: the objects of the other table's files
    can be gone from the store and it still exports, while that table cannot be."""
    rng = np.random.default_rng(0)
    n = 600
    tables = {
        name: [NewItem(f"{name}{i}", packb({"i": i, "b": rng.bytes(1000)})) for i in range(n)]
        for name in ("first", "second")
    }
    build(tmp_path / "d", "hybrid", tables)
    snap = tmp_path / "snap"
    files = small_files(tmp_path / "d" / "rocksdb", snap / "rocksdb", tmp_path / "sst")
    url = (tmp_path / "backups").as_uri()
    manifest = BackupStore(url).upload(snap, {"mode": "hybrid", "tables": {}}).manifest
    db = Rdict(str(snap / "rocksdb"), Options(raw_mode=True))
    tids = {k[1:].decode(): msgpack.unpackb(db[k])["id"] for k in (b"tfirst", b"tsecond")}
    db.close()

    lo, hi = table_ranges(tids["first"])[0]  # the first table's values
    firsts = {f["name"].lstrip("/") for f in files if lo <= f["start_key"] and f["end_key"] < hi}
    assert len(firsts) >= 4, files  # the test needs files that hold only "first"
    for f in manifest.files:
        if Path(f.path).name in firsts:
            (tmp_path / "backups" / f.object).unlink()

    monkeypatch.delenv("RLREPLAY_BACKUP_STORAGE_OPTIONS", raising=False)
    parser = argparse.ArgumentParser(prog="rlreplay")
    add_export_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "second.jsonl"
    argv = ["export", url, "--table", "second", "--format", "jsonl", str(out)]
    assert run_export(parser.parse_args(argv)) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["i"] for r in rows] == list(range(n))
    err = capsys.readouterr().err
    said = re.search(
        r"fetched (\d+) of its (\d+) files \(.*\), those that hold table 'second'", err
    )
    assert said is not None, err
    assert int(said[1]) <= len(manifest.files) - len(firsts)
    assert int(said[2]) == len(manifest.files)
    argv = ["export", url, "--table", "first", "--format", "jsonl", str(tmp_path / "f.jsonl")]
    assert run_export(parser.parse_args(argv)) == 1  # its files are gone
    assert "missing" in capsys.readouterr().err
