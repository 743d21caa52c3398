"""``rlreplay export``: one table's items out of a snapshot, as Parquet or JSON Lines.

From a snapshot of RocksDB (hybrid and disk mode), only the files that hold the table are
fetched (:class:`~rlreplay.app.snapshot_table.SnapshotTable`) and read directly; a memory-mode
snapshot is one file that holds every table, which an in-process
:class:`~rlreplay.app.engine.engine.Engine` recovers in a scratch data directory. Either way
an export holds what a server restored from the snapshot would serve. Items are read in
insertion order, in batches bounded by :data:`BATCH_ITEMS` and :data:`BATCH_BYTES`, and
written batch by batch: memory holds the keys, a batch and a row group, not the table.
The fetch and the rows written show their progress (:class:`~rlreplay.app.progress.Progress`).

An episode table: one row per step, through an engine (:mod:`~rlreplay.app.episode_export`).
Columns: ``key``, ``priority``, ``inserted_at``, ``times_sampled``, then the value's: one per
field of a map with string keys (a field named like those four becomes ``value.<field>``), or
one ``value`` column. Numbers, strings, booleans, bytes, timestamps and arrays of booleans,
integers or floats keep their type; other fields (lists, maps) are in the API's JSON form
(:func:`~rlreplay.wire.codec.to_jsonable`), as JSON text in Parquet.

* JSON Lines: arrays as nested lists, bytes as base64, NaN and the infinities as the strings
  ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.
* Parquet: an array field is a ``list<dtype>`` column of the flattened arrays, plus a
  ``<field>.shape`` column (``list<int64>``) when its arrays in the first batch are not all
  1-D. The first batch fixes the schema; a later value that does not fit it stops the export
  with :class:`~rlreplay.wire.errors.ValidationFailed` naming the column.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import logging
import math
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlreplay.app.backup import (
    LATEST,
    BackupError,
    BackupStore,
    Manifest,
    ProgressInfo,
    SnapshotCorrupt,
    SnapshotNotFound,
)
from rlreplay.app.backup.manifest import check_snapshot_id
from rlreplay.app.engine.engine import Engine
from rlreplay.app.episode_export import step_rows
from rlreplay.app.progress import Progress, format_amount
from rlreplay.app.settings import Settings
from rlreplay.app.snapshot_table import ROCKSDB, SnapshotTable
from rlreplay.app.tables.items import Item
from rlreplay.wire.arrays import BFloat16Array
from rlreplay.wire.codec import to_jsonable, unpackb
from rlreplay.wire.errors import ReplayError, TableNotFound, ValidationFailed

__all__ = ["add_export_parser", "export_snapshot", "export_table", "run_export"]

ExportFormat = Literal["parquet", "jsonl"]

#: The item's own columns, before the value's.
META_COLUMNS = ("key", "priority", "inserted_at", "times_sampled")
BATCH_ITEMS = 1024
BATCH_BYTES = 64 * 2**20
#: Parquet row groups this big read well; a batch alone would make thousands of tiny ones.
ROW_GROUP_ROWS = 65_536
ROW_GROUP_BYTES = 128 * 2**20
_MODES = ("memory", "disk", "hybrid")

log = logging.getLogger("rlreplay.export")


def export_table(data_dir: Path, table: str, fmt: ExportFormat, out: Path, *, mode: str) -> int:
    """Write every item of ``table`` in the data directory ``data_dir`` to the file ``out``.

    The directory is opened by an engine with no default table; its stop checkpoints into
    the directory (the same items), so point it at a copy, not at a live server's. ``out``
    appears only once complete. Runs its own event loop: call it outside one.

    Args:
        data_dir: A server's data directory (``rocksdb/`` or ``memory.ckpt``).
        table: The table to export.
        fmt: ``"parquet"`` or ``"jsonl"``.
        out: The file to write (replaced; its folder is created).
        mode: The storage mode the directory was written in: memory, disk or hybrid.

    Returns:
        The number of rows written.

    Raises:
        TableNotFound: No such table; the message names those there are.
        ValidationFailed: A value does not fit the Parquet schema of the first batch.
        ImportError: Parquet without pyarrow installed.
        ValueError: An unknown format or mode.
    """
    if mode not in _MODES:
        raise ValueError(f"mode ({mode!r}) must be one of {', '.join(_MODES)}")
    return _write(out, fmt, lambda sink: asyncio.run(_read_into(sink, data_dir, table, mode)))


def _write(out: Path, fmt: ExportFormat, fill: Callable[[_JsonlFile | _ParquetFile], int]) -> int:
    """Write ``out`` in ``fmt`` with the rows ``fill`` puts in the sink; ``out`` appears
    only once complete. Returns what ``fill`` returns (the rows written)."""
    sink: _JsonlFile | _ParquetFile
    partial = out.with_name(f".{out.name}.partial")
    if fmt not in ("parquet", "jsonl"):
        raise ValueError(f"format ({fmt!r}) must be parquet or jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    sink = _ParquetFile(partial) if fmt == "parquet" else _JsonlFile(partial)
    try:
        rows = fill(sink)
        sink.finish()
        partial.replace(out)
    finally:
        sink.close()
        partial.unlink(missing_ok=True)
    return rows


def export_snapshot(
    url: str,
    table: str,
    fmt: ExportFormat,
    out: Path,
    *,
    snapshot: str = "latest",
    storage_options: dict[str, Any] | None = None,
) -> int:
    """Export one table of a snapshot at the backup store ``url``.

    The files it needs (those holding the table, of a RocksDB snapshot; the checkpoint
    file, of a memory-mode one) go into a temporary directory (under ``$TMPDIR``), removed
    afterwards. For ``"latest"``, a snapshot that fails verification is passed over for the
    next older one, as a server's ``--restore latest`` does.

    Args:
        url: The backup URL (``s3://bucket/prefix``, ``file:///path``, ``memory://name``).
        table: The table to export.
        fmt: ``"parquet"`` or ``"jsonl"``.
        out: The file to write.
        snapshot: ``"latest"`` or a snapshot id.
        storage_options: fsspec options of the backend (credentials, endpoint).

    Returns:
        The number of rows written.

    Raises:
        BackupError: The snapshot cannot be found, downloaded or verified.
        TableNotFound, ValidationFailed, ImportError: As :func:`export_table`.
    """
    return _export_snapshot(url, table, fmt, out, snapshot, storage_options or {})[0]


def add_export_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``export`` sub-command to the ``rlreplay`` parser's ``commands``."""
    parser = commands.add_parser(
        "export",
        help="write a table of a snapshot to Parquet or JSON Lines, for analysis",
        description=(
            "Download a snapshot from a backup URL and write one table's items (key, "
            "priority, inserted_at, times_sampled and the value's fields) to OUT. Storage "
            "options come from the environment, as for 'serve' (RLREPLAY_BACKUP_STORAGE_OPTIONS)."
        ),
    )
    parser.add_argument("url", metavar="SNAPSHOT_URL", help="backup URL, e.g. s3://bucket/path")
    parser.add_argument("--table", required=True, metavar="NAME", help="the table to export")
    parser.add_argument("--format", required=True, choices=["parquet", "jsonl"], dest="fmt")
    parser.add_argument("--snapshot", default="latest", help="'latest' or a snapshot id")
    parser.add_argument("out", metavar="OUT", type=Path, help="the file to write")


def run_export(args: argparse.Namespace) -> int:
    """Run ``rlreplay export`` with the parsed ``args``; returns the exit status: 2 for a
    mistake in the arguments or the environment, 1 when the export fails. What it fetches
    and how far it is go to stderr (a bar on a terminal, else lines)."""
    try:
        options = BackupStore.options_from_env()
        BackupStore(args.url, storage_options=options)  # a URL it cannot open: say so now
        if args.snapshot != LATEST:
            check_snapshot_id(args.snapshot)
        if args.fmt == "parquet":  # before fetching a snapshot it could not write
            _ParquetFile.modules()
    except (ValueError, ImportError) as exc:
        print(f"rlreplay export: error: {exc}", file=sys.stderr)
        return 2
    # the export's lines on stderr, as "rlreplay export: <line>", for this run
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("rlreplay export: %(message)s"))
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        rows, snapshot_id = _export_snapshot(
            args.url, args.table, args.fmt, args.out, args.snapshot, options
        )
    except (ReplayError, BackupError, ImportError, ValueError, OSError) as exc:
        print(f"rlreplay export: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rlreplay export: interrupted; nothing written", file=sys.stderr)
        return 130
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
    print(
        f"exported {rows} rows of table {args.table!r} from snapshot {snapshot_id} to {args.out}",
        file=sys.stderr,
    )
    return 0


def _export_snapshot(
    url: str,
    table: str,
    fmt: ExportFormat,
    out: Path,
    snapshot: str,
    storage_options: dict[str, Any],
) -> tuple[int, str]:
    """:func:`export_snapshot`, and the id of the snapshot read (``latest`` resolved)."""
    store = BackupStore(url, storage_options=storage_options)
    if snapshot != LATEST:
        manifest = store.get(snapshot)
        return _export_from(store, manifest, table, fmt, out), manifest.id
    refused = []
    for manifest in store.list():
        try:
            return _export_from(store, manifest, table, fmt, out), manifest.id
        except SnapshotCorrupt as exc:
            log.warning("refusing snapshot %s: %s; trying the next older one", manifest.id, exc)
            refused.append(manifest.id)
    why = f" ({len(refused)} refused as corrupt: {', '.join(refused)})" if refused else ""
    raise SnapshotNotFound(f"no usable snapshot at {store.url}{why}")


def _export_from(
    store: BackupStore, manifest: Manifest, table: str, fmt: ExportFormat, out: Path
) -> int:
    """Export ``table`` of the snapshot ``manifest``: its RocksDB files that hold the table,
    or the memory-mode checkpoint through an engine."""
    mode = str(manifest.meta.get("mode", "hybrid"))  # as a server's --restore reads it
    only = manifest.meta.get("only_tables")
    if only is not None and table not in only:  # its files hold more than it restores
        raise TableNotFound(
            f"no table {table!r} in snapshot {manifest.id}; its tables: {', '.join(only)}"
        )
    with tempfile.TemporaryDirectory(prefix="rlreplay-export-") as scratch:
        whole = mode == "memory" or not any(
            f.path.startswith(f"{ROCKSDB}/") for f in manifest.files
        )
        if (manifest.meta.get("tables") or {}).get(table, {}).get("episodes"):
            whole = True  # an episode table's rows are its steps: read through an engine
        if whole:
            log.info(
                "snapshot %s is one checkpoint file holding every table: fetching %s",
                manifest.id,
                format_amount(manifest.bytes, "B"),
            )
            data_dir = Path(scratch) / "data"
            with Progress("fetch", manifest.bytes, log=log) as fetching:
                store.download(manifest.id, data_dir, progress=_following(fetching))
            return export_table(data_dir, table, fmt, out, mode=mode)
        with Progress("fetch", None, log=log) as fetching:
            source = SnapshotTable(
                store, manifest, table, Path(scratch), progress=_growing(fetching)
            )
            try:
                source.open()
            except BaseException:
                source.close()
                raise
        try:
            log.info(
                "snapshot %s: fetched %d of its %d files (%s of %s), those that hold table %r",
                manifest.id,
                source.files_fetched,
                source.files_total,
                format_amount(source.bytes_fetched, "B"),
                format_amount(source.bytes_total, "B"),
                table,
            )
            rows = source.metadata()
            return _write(out, fmt, lambda sink: _copy_rows(source, rows, sink))
        finally:
            source.close()


def _following(shown: Progress) -> Callable[[ProgressInfo], None]:
    return lambda info: shown.advance_to(info.bytes_done)


def _growing(shown: Progress) -> Callable[[int, int], None]:
    """A fetch's callback whose total grows as files are chosen."""

    def on_file(done: int, total: int) -> None:
        if shown.total != total:
            shown.set_total(total)
        shown.advance_to(done)

    return on_file


def _copy_rows(
    source: SnapshotTable,
    rows: list[tuple[str, float, float, int, int, int]],
    sink: _JsonlFile | _ParquetFile,
) -> int:
    """Write the items of ``rows`` in batches bounded in items and value bytes."""
    with Progress("writing", len(rows), log=log, unit="rows") as writing:
        start = 0
        while start < len(rows):
            stop, held = start, 0
            while stop < len(rows) and stop - start < BATCH_ITEMS:
                held += rows[stop][4]
                stop += 1
                if held >= BATCH_BYTES:
                    break
            sink.write([_row(item) for item in source.items(rows[start:stop])])
            writing.advance_to(stop)
            start = stop
    return len(rows)


def _settings(data_dir: Path, mode: str) -> Settings:
    """An engine's settings for reading ``data_dir``, pinned against ``RLREPLAY_*`` variables
    (no restore, no snapshots, no default table).

    Memory mode reads its checkpoint only with the log on, and a directory with a log has
    records past its checkpoint: both open with ``durability="wal"``.
    """
    logged = mode == "memory" or (data_dir / "wal").is_dir()
    options: dict[str, Any] = {
        "data_dir": data_dir,
        "storage_mode": mode,
        "durability": "wal" if logged else "none",
        "wal_writer": "thread",
        "wal_recovery": "strict",
        # memory mode holds every value anyway; the others read from RocksDB, caching little
        "cache_memory_limit_mb": 2.0**30 if mode == "memory" else 64,
        "max_response_mb": 2.0**30,  # batches are bounded by BATCH_BYTES instead
        "default_table": False,
        "backup_url": None,
        "restore": "none",
        "restore_replace": False,
        "max_tables": 1_000_000,
    }
    return Settings(**options)


async def _read_into(sink: _JsonlFile | _ParquetFile, data_dir: Path, table: str, mode: str) -> int:
    """Start an engine over ``data_dir``, write ``table``'s items to ``sink``, stop it."""
    engine = Engine(_settings(data_dir, mode))
    await engine.start()
    try:
        names = engine.table_names()
        if table not in names:
            raise TableNotFound(
                f"no table {table!r}; the tables there: {', '.join(names) or 'none'}"
            )
        written = 0
        episodes = engine.state.tables[table].episodes
        if episodes is not None:  # one row per step (see rlreplay.app.episode_export)
            with Progress("writing", episodes.steps, log=log, unit="rows") as writing:
                for rows in step_rows(episodes, batch_rows=BATCH_ITEMS, batch_bytes=BATCH_BYTES):
                    sink.write(rows)
                    written += len(rows)
                    writing.advance_to(written)
            return written
        total = len(engine.state.tables[table].index)
        with Progress("writing", total, log=log, unit="rows") as writing:
            for keys in _key_batches(engine, table):
                batch = await engine.get_batch(table, keys)
                rows = [_row(item) for item in batch.items() if item is not None]
                sink.write(rows)
                written += len(rows)
                writing.advance_to(written)
        return written
    finally:
        await engine.stop()


def _key_batches(engine: Engine, table: str) -> Iterator[list[str]]:
    """The table's keys in insertion order, in batches bounded in items and value bytes."""
    t = engine.state.tables[table]
    keys = list(t.index)
    slots = np.fromiter(t.index.values(), dtype=np.int64, count=len(keys))
    order = np.argsort(t.order[slots], kind="stable")
    sizes = t.size[slots][order]
    start = 0
    while start < len(keys):
        sums = np.cumsum(sizes[start : start + BATCH_ITEMS])
        stop = start + max(1, int(np.searchsorted(sums, BATCH_BYTES, side="right")))
        yield [keys[i] for i in order[start:stop].tolist()]
        start = stop


def _row(item: Item) -> dict[str, Any]:
    """An item's columns, its value decoded (see the module docstring)."""
    try:
        value = unpackb(item.value)
    except ValueError as exc:
        raise ValidationFailed(f"the value of key {item.key!r}: {exc}") from exc
    row: dict[str, Any] = {
        "key": item.key,
        "priority": item.priority,
        "inserted_at": item.inserted_at,
        "times_sampled": item.times_sampled,
    }
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        row.update({f"value.{k}" if k in META_COLUMNS else k: v for k, v in value.items()})
    else:
        row["value"] = value
    return row


def _array(cell: Any) -> np.ndarray[Any, Any] | None:
    """``cell`` as an array if it is one both formats hold as numbers (bool, int, float)."""
    if isinstance(cell, BFloat16Array):
        return cell.to_float32()
    if isinstance(cell, np.ndarray) and cell.dtype.kind in "biuf" and cell.dtype.itemsize <= 8:
        return cell
    return None


def _json_floats(x: Any) -> Any:
    """``x`` (a float or nested lists) with NaN and the infinities spelled as strings."""
    if isinstance(x, list):
        return [_json_floats(v) for v in x]
    if not isinstance(x, float) or math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _json_cell(cell: Any) -> Any:
    """A cell as JSON Lines holds it (see the module docstring)."""
    if cell is None or isinstance(cell, bool | int | float | str):
        return _json_floats(cell)
    if isinstance(cell, bytes):
        return base64.b64encode(cell).decode("ascii")
    if isinstance(cell, datetime.datetime):
        return cell.isoformat()
    array = _array(cell)
    if array is None:
        return to_jsonable(cell)
    listed = array.tolist()
    return listed if array.dtype.kind != "f" or np.isfinite(array).all() else _json_floats(listed)


def _parquet_cell(cell: Any) -> Any:
    """A cell as pyarrow converts it: scalars and arrays as they are, others as JSON text."""
    if cell is None or isinstance(cell, bool | int | float | str | bytes | datetime.datetime):
        return cell
    array = _array(cell)
    return array if array is not None else json.dumps(to_jsonable(cell), allow_nan=False)


class _JsonlFile:
    """Rows as JSON Lines."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("w", encoding="utf-8")

    def write(self, rows: list[dict[str, Any]]) -> None:
        self._file.writelines(
            json.dumps({k: _json_cell(v) for k, v in row.items()}, allow_nan=False) + "\n"
            for row in rows
        )

    def close(self) -> None:
        self._file.close()

    finish = close


class _ParquetFile:
    """Rows as a Parquet file whose schema the first batch fixes, written in row groups."""

    def __init__(self, path: Path) -> None:
        self._pa, self._pq = self.modules()
        self._path = path
        self._schema: Any = None
        self._writer: Any = None
        self._held: list[Any] = []  # tables not yet written: the next row group
        self._held_rows = self._held_bytes = 0

    @staticmethod
    def modules() -> tuple[Any, Any]:
        """``pyarrow`` and ``pyarrow.parquet``; ImportError saying how to install them."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(
                "Parquet export needs pyarrow: pip install -e '.[export]' in a clone of "
                "rlreplay (or pip install pyarrow), or --format jsonl"
            ) from exc
        return pa, pq

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        table = self._table(rows)
        self._held.append(table)
        self._held_rows += table.num_rows
        self._held_bytes += table.nbytes
        if self._held_rows >= ROW_GROUP_ROWS or self._held_bytes >= ROW_GROUP_BYTES:
            self._write_held()

    def finish(self) -> None:
        if self._writer is None:  # an empty table: a file with the item columns
            pa = self._pa
            types = [pa.string(), pa.float64(), pa.float64(), pa.int64()]
            self._schema = pa.schema(list(zip(META_COLUMNS, types, strict=True)))
            self._writer = self._pq.ParquetWriter(self._path, self._schema)
        self._write_held()
        self._writer.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def _write_held(self) -> None:
        if self._held:
            self._writer.write_table(self._pa.concat_tables(self._held))
        self._held, self._held_rows, self._held_bytes = [], 0, 0

    def _table(self, rows: list[dict[str, Any]]) -> Any:
        """The rows as a table of the schema (fixed here by the first batch)."""
        pa = self._pa
        first, last = rows[0], rows[-1]
        where = (
            f"keys {first['key']!r} to {last['key']!r}"
            if "key" in first
            else f"steps {first['episode']!r}@{first['step']} to {last['episode']!r}@{last['step']}"
        )
        columns: dict[str, Any] = {}
        for name in dict.fromkeys(name for row in rows for name in row):
            try:
                columns.update(self._columns(name, [_parquet_cell(row.get(name)) for row in rows]))
            except pa.ArrowException as exc:
                raise ValidationFailed(f"column {name!r} of {where}: {exc}") from exc
        if self._schema is None:
            self._schema = pa.schema([(name, col.type) for name, col in columns.items()])
            self._writer = self._pq.ParquetWriter(self._path, self._schema)
        extra = [name for name in columns if name not in self._schema.names]
        if extra:
            raise ValidationFailed(
                f"column {extra[0]!r} first appears in {where}, after the first batch fixed "
                "the Parquet schema; export as jsonl"
            )
        arrays = []
        for field in self._schema:
            col = columns.get(field.name)
            if col is None:
                col = pa.nulls(len(rows), field.type)
            elif col.type != field.type:
                try:
                    col = col.cast(field.type)
                except pa.ArrowException as exc:
                    raise ValidationFailed(
                        f"column {field.name!r} of {where} holds {col.type}, which does not "
                        f"fit the {field.type} of the first batch ({exc}); export as jsonl"
                    ) from exc
            arrays.append(col)
        return pa.Table.from_arrays(arrays, schema=self._schema)

    def _columns(self, name: str, cells: list[Any]) -> dict[str, Any]:
        """The column ``name`` from its cells; arrays also give ``<name>.shape`` when needed."""
        pa = self._pa
        arrays = [c for c in cells if isinstance(c, np.ndarray)]
        if not arrays:
            return {name: pa.array(cells)}
        if len(arrays) != sum(c is not None for c in cells):
            raise ValidationFailed(f"column {name!r} mixes arrays and other values")
        dtype = np.result_type(*{a.dtype for a in arrays}).newbyteorder("=")
        flat = [None if c is None else np.ravel(c).astype(dtype, copy=False) for c in cells]
        out = {name: pa.array(flat, type=pa.list_(pa.from_numpy_dtype(dtype)))}
        shape = f"{name}.shape"
        shaped = any(a.ndim != 1 for a in arrays)
        if self._schema is not None and shape not in self._schema.names:
            if shaped:  # the first batch had 1-D arrays only: the shapes would be lost
                raise ValidationFailed(
                    f"column {name!r} holds arrays that are not 1-D, past a first batch of 1-D "
                    "ones; export as jsonl"
                )
        elif shaped or self._schema is not None:
            shapes = [None if c is None else list(c.shape) for c in cells]
            out[shape] = pa.array(shapes, type=pa.list_(pa.int64()))
        return out
