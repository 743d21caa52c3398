"""Big batches at the speed of the socket: rlreplay's bandwidth next to the socket's own.

In one run, medians of 3 rounds (each figure a run of ``--duration`` seconds, the rounds
alternating TCP and the Unix socket first):

* baselines: a NumPy copy of 16 MiB (``np.copyto`` into a buffer reused); TCP on 127.0.0.1
  and a Unix domain socket between two Python processes (``sendall`` of 16 MiB, the other
  process ``recv_into`` a buffer of its own, then one byte back), each measured in every
  round just before and just after rlreplay's figures on that socket (their mean is the
  round's baseline; a ratio is the median of the rounds' ratios, so a noisy minute weighs
  on both sides alike); the disk under the server's data folder (16 MiB written with
  ``O_DIRECT`` and ``fdatasync``ed, as the write-ahead log does: a push answered under
  ``wal`` waits for it);
* rlreplay (``rlreplay serve``, hybrid with ``wal``, on TCP and on ``--uds``; one
  ``ReplayClient`` in the bench's process): ``get_many`` of every item, ``sample`` of as
  many, ``stream`` (``prefetch=2``) and pushes replacing the same keys (``push`` for the
  items layout, ``push_columns`` for the columns layout), in both layouts, for four
  shapes: 512 x 4 KiB (uint8), 32 x 400 KiB (int32 tokens), 4 x 4 MiB (uint8), and 64
  variable-length token rows (2 to 32 k int32 tokens, two fields: tokens and float32
  log-probabilities; ``cu_seqlens`` in columns, which ``push_columns`` cannot take).
  The pushes run once more with :data:`PIPELINED` calls in flight (``asyncio.gather``, each
  replacing keys of its own), so that the write-ahead log's group commit can share its
  fdatasyncs among them.

GB/s counts the arrays' bytes (not msgpack's framing); the ratio is to the socket baseline
of the same transport. With ``--arms`` the columnar reads run again with each fast path off
(:data:`ARMS`), in alternate rounds, against the same data: the client's receive buffers
(answers read into reused buffers, ``wire/buffer_pool.py``, and arrays decoded as views of
them, ``clients/columns.py``), the client's one wake per long body
(``clients/connection.py``), the server's slices of values from 4 KiB (off: values under 64
KiB joined, then gathered), the server's writev (values' slices sent where they lie,
``app/api/gathered_writes.py``: off, gathered into a reused buffer), and every server fast
path (``app/api/column_answers.py``, ``app/tables/stacking.py``: off, values joined and
copied into a fresh buffer). Reads in the items layout run again with theirs off
(:data:`ITEM_ARMS`): the client's views (off: arrays copied out of the answer) and the
server's answers in pieces (``app/api/envelopes.py``: off, joined). Pushes run again with
each of theirs off (:data:`PUSH_ARMS`): the client's pieces (``clients/body_pieces.py``:
off, each body joined before it is sent), the server's bodies read straight into one buffer
(``app/api/direct_bodies.py``: off, as uvicorn reads them, chunks copied and joined) and
glibc's mmap threshold at 32 MiB (``wire/allocator.py``: off, at 4 MiB, so that each value
of 4 MiB is a mapping of its own), and the server's pool of body buffers keeping one for
each of four pushes in flight (off: two, as before; it shows in ``push_columns x4``).

With ``--zstd`` (or ``--arms``), compressible batches (token ids of a 32 k vocabulary and
masks) move with ``Content-Encoding: zstd`` on and off.

Run: ``python -m bench.bulk [--duration 1.0] [--rounds 3] [--quick] [--arms] [--zstd]
[--shapes 4k,400k,4m,rows]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import mmap
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import aclosing, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from bench.http import free_port, stop_process
from bench.report import print_table
from rlreplay.app.cli import serve_command
from rlreplay.clients import ReplayClient, tune_malloc

MIB = 1 << 20
BASELINE_BYTES = 16 * MIB
TABLE_PREFIX = "bulk"


# --- the shapes ---------------------------------------------------------------------------------


def _shapes(rng: np.random.Generator) -> dict[str, list[dict[str, np.ndarray]]]:
    """Each shape's items' values, by name."""
    tokens = rng.integers(0, 2**31 - 1, (32, 100 * 1024), dtype=np.int32)
    big = rng.integers(0, 256, (4, 4 * MIB), dtype=np.uint8)
    small = rng.integers(0, 256, (512, 4096), dtype=np.uint8)
    lengths = rng.integers(2048, 32 * 1024 + 1, 64)
    varlen = [
        {
            "tokens": rng.integers(0, 2**31 - 1, int(n), dtype=np.int32),
            "logp": rng.standard_normal(int(n)).astype(np.float32),
        }
        for n in lengths
    ]
    return {
        "512 x 4 KiB": [{"x": row} for row in small],
        "32 x 400 KiB": [{"tokens": row} for row in tokens],
        "4 x 4 MiB": [{"x": row} for row in big],
        "64 token rows": varlen,
    }


#: Short names for ``--shapes``.
SHAPE_NAMES = {
    "4k": "512 x 4 KiB",
    "400k": "32 x 400 KiB",
    "4m": "4 x 4 MiB",
    "rows": "64 token rows",
}


def _payload_bytes(values: list[dict[str, np.ndarray]]) -> int:
    return sum(array.nbytes for value in values for array in value.values())


def _stackable(values: list[dict[str, np.ndarray]]) -> bool:
    first = values[0]
    return all(v[name].shape == a.shape for v in values for name, a in first.items())


# --- baselines ----------------------------------------------------------------------------------


def numpy_copy_gbps(seconds: float) -> float:
    src = np.random.default_rng(0).integers(0, 256, BASELINE_BYTES, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    copies, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds or copies < 3:
        np.copyto(dst, src)
        copies += 1
    return copies * BASELINE_BYTES / elapsed / 1e9


_RECEIVER = """
import socket, sys
family, address, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
if family == "unix":
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
else:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
buf = bytearray(size)
view = memoryview(buf)
while True:
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if not n:
            sys.exit(0)
        got += n
    sock.sendall(b"k")
"""


def socket_gbps(family: str, folder: Path, seconds: float) -> float:
    """One process ``sendall``s 16 MiB, another ``recv_into``s a buffer and answers a byte."""
    if family == "unix":
        path = str(folder / "baseline.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        address = path
    else:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{listener.getsockname()[1]}"
    listener.listen(1)
    receiver = subprocess.Popen(
        [sys.executable, "-c", _RECEIVER, family, address, str(BASELINE_BYTES)]
    )
    try:
        conn, _ = listener.accept()
        with conn:
            payload = np.random.default_rng(1).integers(0, 256, BASELINE_BYTES, np.uint8)
            data = memoryview(payload.data)
            sends, t0 = 0, 0.0
            for i in range(10**6):
                if i == 1:  # the first send warms both ends up
                    t0 = time.perf_counter()
                conn.sendall(data)
                if conn.recv(1) != b"k":
                    raise RuntimeError("the receiver went away")
                sends = i
                if i and time.perf_counter() - t0 >= seconds and i >= 3:
                    break
            elapsed = time.perf_counter() - t0
    finally:
        listener.close()
        receiver.wait(30)
        if family == "unix":
            os.unlink(address)
    return sends * BASELINE_BYTES / elapsed / 1e9


def disk_gbps(folder: Path, seconds: float) -> float:
    """16 MiB written to a file in ``folder`` and ``fdatasync``ed, over and over (with
    ``O_DIRECT`` where the filesystem takes it, as the write-ahead log writes): what a push
    answered under ``wal`` waits for."""
    path = folder / "disk-baseline"
    buf = mmap.mmap(-1, BASELINE_BYTES)  # page aligned, as O_DIRECT needs
    buf.write(np.random.default_rng(2).integers(0, 256, BASELINE_BYTES, np.uint8).tobytes())
    try:
        for direct in (getattr(os, "O_DIRECT", 0), 0):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct)
            try:
                writes, t0 = 0, time.perf_counter()
                while (elapsed := time.perf_counter() - t0) < seconds or writes < 3:
                    os.pwrite(fd, buf, 0)
                    os.fdatasync(fd)
                    writes += 1
                return writes * BASELINE_BYTES / elapsed / 1e9
            except OSError:  # O_DIRECT refused (tmpfs, some filesystems): buffered then
                if not direct:
                    raise
            finally:
                os.close(fd)
        raise AssertionError("unreachable")  # pragma: no cover
    finally:
        path.unlink(missing_ok=True)
        buf.close()


# --- rlreplay -----------------------------------------------------------------------------------


async def _rate(call: Callable[[], Awaitable[int]], seconds: float) -> float:
    """Bytes/s of ``call`` (which returns the bytes it moved), repeated for ``seconds``."""
    await call()  # warm
    moved, calls, t0 = 0, 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds or calls < 3:
        moved += await call()
        calls += 1
    return moved / elapsed


async def _stream_rate(
    rb: ReplayClient, table: str, n: int, nbytes: int, layout: Any, seconds: float
) -> float:
    batches = rb.stream(table, batch_size=n, prefetch=2, layout=layout)
    async with aclosing(batches) as stream:
        got, t0 = -1, 0.0
        async for _ in stream:
            got += 1
            if got == 0:
                t0 = time.perf_counter()
            elif time.perf_counter() - t0 >= seconds and got >= 3:
                break
        return got * nbytes / (time.perf_counter() - t0)


async def _fill(rb: ReplayClient, table: str, values: list[dict[str, np.ndarray]]) -> list[str]:
    await rb.create_table(table)
    keys = [f"k{i}" for i in range(len(values))]
    for start in range(0, len(values), 8):
        items = [{"key": k, "value": v} for k, v in zip(keys, values, strict=True)][
            start : start + 8
        ]
        await rb.push(table, items, wait=True)
    return keys


async def _shape_rates(
    rb: ReplayClient, table: str, values: list[dict[str, np.ndarray]], seconds: float
) -> dict[tuple[str, str], float]:
    """(op, layout) -> bytes/s of one shape's table."""
    keys = [f"k{i}" for i in range(len(values))]
    n, nbytes = len(values), _payload_bytes(values)
    items = [{"key": k, "value": v} for k, v in zip(keys, values, strict=True)]
    rates: dict[tuple[str, str], float] = {}
    for layout in ("items", "columns"):

        async def get_many(layout: Any = layout) -> int:
            await rb.get_many(table, keys, layout=layout)
            return nbytes

        async def sample(layout: Any = layout) -> int:
            await rb.sample(table, n, layout=layout)
            return nbytes

        rates["get_many", layout] = await _rate(get_many, seconds)
        rates["sample", layout] = await _rate(sample, seconds)
        rates["stream", layout] = await _stream_rate(rb, table, n, nbytes, layout, seconds)

    async def push() -> int:
        await rb.push(table, items)
        return nbytes

    # the same pushes, PIPELINED of them in flight, each replacing keys of its own: under
    # `wal` one push in flight waits for its own fdatasync; several share the log's flushes
    slots = [[f"p{j}-{k}" for k in keys] for j in range(PIPELINED)]
    slot_items = [[{"key": k, "value": v} for k, v in zip(ks, values, strict=True)] for ks in slots]

    async def pushes() -> int:
        await asyncio.gather(*(rb.push(table, its) for its in slot_items))
        return nbytes * PIPELINED

    rates["push", "items"] = await _rate(push, seconds)
    rates["pushes", "items"] = await _rate(pushes, seconds)
    if _stackable(values):  # push_columns takes no rows of varying length
        columns = {field: np.stack([v[field] for v in values]) for field in values[0]}

        async def push_columns() -> int:
            await rb.push_columns(table, keys, columns)
            return nbytes

        async def pushes_columns() -> int:
            await asyncio.gather(*(rb.push_columns(table, ks, columns) for ks in slots))
            return nbytes * PIPELINED

        rates["push", "columns"] = await _rate(push_columns, seconds)
        rates["pushes", "columns"] = await _rate(pushes_columns, seconds)
    return rates


async def rlreplay_rates(
    url: str, shapes: dict[str, list[dict[str, np.ndarray]]], seconds: float
) -> dict[tuple[str, str, str], float]:
    """(shape, op, layout) -> bytes/s over ``url``."""
    rates: dict[tuple[str, str, str], float] = {}
    async with ReplayClient(url, timeout_s=120) as rb:
        tables = {t["name"] for t in await rb.list_tables()}
        for index, (name, values) in enumerate(shapes.items()):
            table = f"{TABLE_PREFIX}{index}"
            if table not in tables:
                await _fill(rb, table, values)
            for (op, layout), rate in (await _shape_rates(rb, table, values, seconds)).items():
                rates[name, op, layout] = rate
    return rates


OPS = ("get_many", "sample", "stream", "push", "pushes")
#: Pushes in flight at once in the ``pushes`` rows.
PIPELINED = 4

#: A server with some of its columnar-answer fast paths off (``{off}``: Python run first).
_SERVER_WITH = """
import runpy, sys
import rlreplay.app.api.column_answers as answers
import rlreplay.app.api.envelopes as envelopes
import rlreplay.app.tables.stacking as stacking
import rlreplay.app.api.direct_bodies as direct
import rlreplay.wire.allocator as allocator
from rlreplay.wire.buffer_pool import BufferPool
{off}
sys.argv = ["rlreplay"] + sys.argv[1:]
runpy.run_module("rlreplay.app", run_name="__main__")
"""
#: Values' slices gathered into a reused buffer rather than sent where they lie.
_NO_WRITEV = "answers.SEND_AS_THEY_LIE = False"
#: Values under 64 KiB (the 4 KiB rows) joined, then gathered into a reused buffer, rather
#: than sent as slices of each.
_NO_SMALL_SLICES = "stacking.ROW_SLICES_BYTES = 64 << 10"
#: Every server fast path off: values joined, then copied into a fresh buffer.
_SERVER_OFF = (
    "answers.SEND_AS_THEY_LIE = False\n"
    "envelopes.SEND_AS_THEY_LIE = False\n"
    "answers._ANSWERS = BufferPool(max_buffers=0)\n"
    "stacking.ROW_SLICES_BYTES = 1 << 62"
)


class _ClientOff:
    """The client's buffer fast paths off while in use: a fresh buffer per answer, arrays
    copied."""

    def __enter__(self) -> None:
        import rlreplay.clients.requester as requester
        import rlreplay.clients.transport as transport
        from rlreplay.wire.buffer_pool import BufferPool
        from rlreplay.wire.codec import unpackb

        self._saved = (requester.decode_views, transport.BufferPool)
        requester.decode_views = unpackb  # type: ignore[assignment]
        transport.BufferPool = lambda max_buffers: BufferPool(max_buffers=0)  # type: ignore[assignment,misc]

    def __exit__(self, *exc: object) -> None:
        import rlreplay.clients.requester as requester
        import rlreplay.clients.transport as transport

        requester.decode_views, transport.BufferPool = self._saved  # type: ignore[assignment]


class _WakeOnEveryRead:
    """The client's reader woken on every read of a long body, not once when complete."""

    def __enter__(self) -> None:
        import rlreplay.clients.connection as connection

        connection.WAKE_ON_BODY = False

    def __exit__(self, *exc: object) -> None:
        import rlreplay.clients.connection as connection

        connection.WAKE_ON_BODY = True


#: The arms of ``--arms``: name -> (the server's fast paths turned off, or None; the
#: client's, as a context manager class, or None).
ARMS: dict[str, tuple[str | None, Any]] = {
    "on": (None, None),
    "client buffers off": (None, _ClientOff),
    "one wake off": (None, _WakeOnEveryRead),
    "small slices off": (_NO_SMALL_SLICES, None),
    "writev off": (_NO_WRITEV, None),
    "server off": (_SERVER_OFF, None),
}


#: Items-layout answers joined on the server rather than sent in pieces.
_NO_ITEM_PIECES = "envelopes.SEND_AS_THEY_LIE = False"


class _ItemViewsOff:
    """The client's arrays copied out of the answer (``unpackb``), not views of it."""

    def __enter__(self) -> None:
        import rlreplay.clients.requester as requester
        from rlreplay.wire.codec import unpackb

        self._saved = requester.decode_views
        requester.decode_views = unpackb  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        import rlreplay.clients.requester as requester

        requester.decode_views = self._saved  # type: ignore[assignment]


class _LastLayoutOff:
    """The client's array views without the last payload layout's shortcut: a dict lookup
    and a tuple built per array (``clients/columns.py``)."""

    def __enter__(self) -> None:
        import msgspec

        import rlreplay.clients.columns as columns

        self._saved = columns._VIEWS
        columns._VIEWS = msgspec.msgpack.Decoder(ext_hook=columns._array_view_seen)  # type: ignore[misc]

    def __exit__(self, *exc: object) -> None:
        import rlreplay.clients.columns as columns

        columns._VIEWS = self._saved  # type: ignore[misc]


#: The arms of ``--arms`` for reads in the items layout, as :data:`ARMS`.
ITEM_ARMS: dict[str, tuple[str | None, Any]] = {
    "on": (None, None),
    "last layout off": (None, _LastLayoutOff),
    "client views off": (None, _ItemViewsOff),
    "server pieces off": (_NO_ITEM_PIECES, None),
    "both off": (_NO_ITEM_PIECES, _ItemViewsOff),
}


async def _read_rates(
    url: str,
    shapes: dict[str, list[dict[str, np.ndarray]]],
    seconds: float,
    layout: Any = "columns",
) -> dict[tuple[str, str], float]:
    """(shape, op) -> bytes/s of get_many and sample in ``layout`` over ``url``."""
    rates: dict[tuple[str, str], float] = {}
    async with ReplayClient(url, timeout_s=120) as rb:
        tables = {t["name"] for t in await rb.list_tables()}
        for index, (name, values) in enumerate(shapes.items()):
            table = f"{TABLE_PREFIX}{index}"
            if table not in tables:
                await _fill(rb, table, values)
            keys = [f"k{i}" for i in range(len(values))]
            nbytes = _payload_bytes(values)

            async def get_many(
                table: str = table, keys: list[str] = keys, nbytes: int = nbytes
            ) -> int:
                await rb.get_many(table, keys, layout=layout)
                return nbytes

            async def sample(table: str = table, n: int = len(keys), nbytes: int = nbytes) -> int:
                await rb.sample(table, n, layout=layout)
                return nbytes

            rates[name, "get_many"] = await _rate(get_many, seconds)
            rates[name, "sample"] = await _rate(sample, seconds)
    return rates


def _arm_runs(
    root: Path,
    prefix: str,
    arms: dict[str, tuple[str | None, Any]],
    rates: Callable[[str, Any, float], Coroutine[Any, Any, dict[tuple[str, str], float]]],
    shapes: dict[str, list[dict[str, np.ndarray]]],
    seconds: float,
    rounds: int,
) -> dict[tuple[str, str], list[dict[tuple[str, str], float]]]:
    """``rates`` of every arm on both sockets, a server per arm's server flag (in alternate
    orders, round by round): (arm, socket) -> each round's rates."""
    servers = {off for off, _ in arms.values()}
    procs, urls = {}, {}
    for i, off in enumerate(servers):
        command = None if off is None else [sys.executable, "-c", _SERVER_WITH.format(off=off)]
        sock = root / f"{prefix}{i}.sock"
        procs[off], tcp = _server(root / f"{prefix}-{i}", sock, command=command)
        urls[off] = {"tcp": tcp, "unix": f"unix://{sock}"}
    runs: dict[tuple[str, str], list[dict[tuple[str, str], float]]] = {}
    try:
        for r in range(rounds):
            names = list(arms) if r % 2 == 0 else list(arms)[::-1]
            for family in ("tcp", "unix"):
                for arm in names:
                    off, client = arms[arm]
                    with client() if client is not None else nullcontext():
                        got = asyncio.run(rates(urls[off][family], shapes, seconds))
                    runs.setdefault((arm, family), []).append(got)
    finally:
        for proc in procs.values():
            stop_process(proc)
    return runs


def _arm_table(
    arms: dict[str, tuple[str | None, Any]],
    runs: dict[tuple[str, str], list[dict[tuple[str, str], float]]],
    keys: list[tuple[str, str]],
) -> tuple[list[str], list[list[object]]]:
    """The table of :func:`_arm_runs`: per (shape, call) and socket, GB/s with every path on,
    then each arm's GB/s and the ratio on / off."""
    headers = ["shape", "call", "socket", "on"]
    for arm in list(arms)[1:]:
        headers += [arm, "on / off"]
    rows: list[list[object]] = []
    for key in keys:
        for family in ("tcp", "unix"):
            gbps = {
                arm: statistics.median(run[key] for run in runs[arm, family]) / 1e9 for arm in arms
            }
            row: list[object] = [*key, family, gbps["on"]]
            for arm in list(arms)[1:]:
                row += [gbps[arm], f"{gbps['on'] / gbps[arm]:.2f}x"]
            rows.append(row)
    return headers, rows


def arm_rows(
    root: Path, shapes: dict[str, list[dict[str, np.ndarray]]], seconds: float, rounds: int
) -> tuple[list[str], list[list[object]]]:
    """Columnar reads with every fast path on, then each arm of :data:`ARMS` (in alternate
    orders, round by round): the table's headers and rows."""
    runs = _arm_runs(root, "arm", ARMS, _read_rates, shapes, seconds, rounds)
    keys = [(name, op) for name in shapes for op in ("get_many", "sample")]
    return _arm_table(ARMS, runs, keys)


def item_arm_rows(
    root: Path, shapes: dict[str, list[dict[str, np.ndarray]]], seconds: float, rounds: int
) -> tuple[list[str], list[list[object]]]:
    """Items-layout reads with every fast path on, then each arm of :data:`ITEM_ARMS`."""
    rates = functools.partial(_read_rates, layout="items")
    runs = _arm_runs(root, "items", ITEM_ARMS, rates, shapes, seconds, rounds)
    keys = [(name, op) for name in shapes for op in ("get_many", "sample")]
    return _arm_table(ITEM_ARMS, runs, keys)


#: Request bodies read the way uvicorn's protocol reads them (chunks copied, then joined)
#: rather than straight into one buffer (``app/api/direct_bodies.py``).
_NO_DIRECT_BODIES = "direct.DIRECT_BODY_BYTES = 1 << 62"
#: glibc's mmap threshold at 4 MiB: every value of 4 MiB or more a mapping of its own.
_MMAP_4_MIB = "allocator.MMAP_THRESHOLD = 4 << 20"


class _JoinedBodies:
    """The client's pushes joined into one body before they are sent, not sent as pieces."""

    def __enter__(self) -> None:
        import rlreplay.clients.bodies as bodies

        bodies.SEND_IN_PIECES = False

    def __exit__(self, *exc: object) -> None:
        import rlreplay.clients.bodies as bodies

        bodies.SEND_IN_PIECES = True


class _QuarterMibSteps:
    """The client's long pieces written to the transport 256 KiB at a time (as until
    2026-11-28), not 1 MiB."""

    def __enter__(self) -> None:
        import rlreplay.clients.exchange as exchange

        self._saved = exchange.WRITE_PIECE
        exchange.WRITE_PIECE = 256 << 10

    def __exit__(self, *exc: object) -> None:
        import rlreplay.clients.exchange as exchange

        exchange.WRITE_PIECE = self._saved


#: The arms of ``--arms`` for pushes, as :data:`ARMS`.
#: The server's pool of body buffers keeping two (as until 2026-11-28), not one for each of
#: four pushes in flight: the third and fourth bodies read into fresh, zeroed buffers.
_TWO_BODY_BUFFERS = "direct._BUFFERS.pool = BufferPool(max_buffers=2)"
PUSH_ARMS: dict[str, tuple[str | None, Any]] = {
    "on": (None, None),
    "client pieces off": (None, _JoinedBodies),
    "256 KiB steps": (None, _QuarterMibSteps),
    "direct bodies off": (_NO_DIRECT_BODIES, None),
    "mmap 4 MiB": (_MMAP_4_MIB, None),
    "2 body buffers": (_TWO_BODY_BUFFERS, None),
}


async def _push_rates(
    url: str, shapes: dict[str, list[dict[str, np.ndarray]]], seconds: float
) -> dict[tuple[str, str], float]:
    """(shape, call) -> bytes/s of ``push`` (items) and ``push_columns`` over ``url``."""
    rates: dict[tuple[str, str], float] = {}
    async with ReplayClient(url, timeout_s=120) as rb:
        tables = {t["name"] for t in await rb.list_tables()}
        for index, (name, values) in enumerate(shapes.items()):
            table = f"{TABLE_PREFIX}{index}"
            if table not in tables:
                await _fill(rb, table, values)
            keys = [f"k{i}" for i in range(len(values))]
            items = [{"key": k, "value": v} for k, v in zip(keys, values, strict=True)]
            nbytes = _payload_bytes(values)

            async def push(
                table: str = table, items: list[dict[str, Any]] = items, nbytes: int = nbytes
            ) -> int:
                await rb.push(table, items)
                return nbytes

            rates[name, "push"] = await _rate(push, seconds)
            if _stackable(values):
                columns = {f: np.stack([v[f] for v in values]) for f in values[0]}

                async def push_columns(
                    table: str = table,
                    keys: list[str] = keys,
                    columns: dict[str, np.ndarray] = columns,
                    nbytes: int = nbytes,
                ) -> int:
                    await rb.push_columns(table, keys, columns)
                    return nbytes

                rates[name, "push_columns"] = await _rate(push_columns, seconds)
                slots = [[f"p{j}-{k}" for k in keys] for j in range(PIPELINED)]

                async def pushes_columns(
                    table: str = table,
                    slots: list[list[str]] = slots,
                    columns: dict[str, np.ndarray] = columns,
                    nbytes: int = nbytes,
                ) -> int:
                    await asyncio.gather(*(rb.push_columns(table, ks, columns) for ks in slots))
                    return nbytes * PIPELINED

                rates[name, f"push_columns x{PIPELINED}"] = await _rate(pushes_columns, seconds)
    return rates


def push_arm_rows(
    root: Path, shapes: dict[str, list[dict[str, np.ndarray]]], seconds: float, rounds: int
) -> tuple[list[str], list[list[object]]]:
    """Pushes with every fast path on, then each arm of :data:`PUSH_ARMS` off (in alternate
    orders, round by round): the table's headers and rows."""
    runs = _arm_runs(root, "push", PUSH_ARMS, _push_rates, shapes, seconds, rounds)
    return _arm_table(PUSH_ARMS, runs, list(runs["on", "tcp"][0]))


def _compressible(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """64 rows of 16 k int32 tokens from a 32 k vocabulary, Zipf-like, with a uint8 mask."""
    ranks = np.minimum(rng.zipf(1.3, (64, 16 * 1024)), 32_000).astype(np.int32)
    return {"tokens": ranks, "mask": (rng.random((64, 16 * 1024)) < 0.95).astype(np.uint8)}


async def _zstd_rates(
    url: str, columns: dict[str, np.ndarray], seconds: float, compression: str | None
) -> dict[str, float]:
    """Call -> bytes/s of columnar get_many, sample and push_columns of ``columns``."""
    n = len(next(iter(columns.values())))
    keys = [f"k{i}" for i in range(n)]
    nbytes = sum(column.nbytes for column in columns.values())
    async with ReplayClient(url, timeout_s=120, compression=compression) as rb:
        await rb.create_table("zstd")
        await rb.push_columns("zstd", keys, columns, wait=True)

        async def get_many() -> int:
            await rb.get_many("zstd", keys, layout="columns")
            return nbytes

        async def sample() -> int:
            await rb.sample("zstd", n, layout="columns")
            return nbytes

        async def push_columns() -> int:
            await rb.push_columns("zstd", keys, columns)
            return nbytes

        return {
            "get_many": await _rate(get_many, seconds),
            "sample": await _rate(sample, seconds),
            "push_columns": await _rate(push_columns, seconds),
        }


def zstd_rows(root: Path, seconds: float, rounds: int) -> list[list[object]]:
    """Compressible batches with ``Content-Encoding: zstd`` on and off (a server run with
    ``--zstd``; the client's ``compression`` option), over TCP and the Unix socket."""
    from rlreplay.wire.compression import compress

    columns = _compressible(np.random.default_rng(3))
    raw = b"".join(column.tobytes() for column in columns.values())
    ratio = len(raw) / len(compress([raw]))
    sock = root / "zstd.sock"
    proc, url = _server(root / "zstd", sock, flags=("--zstd",))
    urls = {"tcp": url, "unix": f"unix://{sock}"}
    runs: dict[tuple[str, str | None], list[dict[str, float]]] = {}
    try:
        for r in range(rounds):
            for family in ("tcp", "unix"):
                for coding in ("zstd", None) if r % 2 == 0 else (None, "zstd"):
                    got = asyncio.run(_zstd_rates(urls[family], columns, seconds, coding))
                    runs.setdefault((family, coding), []).append(got)
    finally:
        stop_process(proc)
    rows: list[list[object]] = []
    for family in ("tcp", "unix"):
        for call in ("get_many", "sample", "push_columns"):
            on, off = (
                statistics.median(run[call] for run in runs[family, coding]) / 1e9
                for coding in ("zstd", None)
            )
            rows.append([call, family, f"{ratio:.1f}x", on, off, f"{on / off:.2f}x"])
    return rows


def _server(
    workdir: Path, sock: Path, command: list[str] | None = None, flags: tuple[str, ...] = ()
) -> Any:
    """``rlreplay serve`` (hybrid, ``wal``) on 127.0.0.1 and on ``sock``: (process, TCP URL)."""
    port = free_port()
    cmd = serve_command(
        port,
        workdir / "data",
        *flags,
        "--uds",
        str(sock),
        "--max-request-mb",
        "256",
        "--max-response-mb",
        "256",
        "--log-level",
        "warning",
    )
    if command is not None:  # the same flags, another way in
        cmd = command + cmd[3:]
    url = f"http://127.0.0.1:{port}"
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    _wait_ready(url, proc)
    return proc, url


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server not ready in 60 s")


def _call_name(op: str, layout: str) -> str:
    if op in ("push", "pushes"):
        call = "push_columns" if layout == "columns" else "push"
        return call if op == "push" else f"{call} x{PIPELINED}"
    return op


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bulk", description=__doc__)
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per figure")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="0.25 s per figure")
    parser.add_argument("--arms", action="store_true", help="fast paths on and off")
    parser.add_argument("--zstd", action="store_true", help="zstd on and off (with --arms too)")
    parser.add_argument(
        "--durability",
        choices=("wal", "none"),
        default="wal",
        help="the server's durability (wal: a push answered once its body is on disk)",
    )
    parser.add_argument(
        "--shapes",
        default=",".join(SHAPE_NAMES),
        help=f"the shapes to run, comma-separated, of {','.join(SHAPE_NAMES)} (all by default)",
    )
    args = parser.parse_args(argv)
    unknown = set(args.shapes.split(",")) - set(SHAPE_NAMES)
    if unknown:
        parser.error(f"unknown shapes: {', '.join(sorted(unknown))}")
    picked = [SHAPE_NAMES[name] for name in args.shapes.split(",")]
    seconds = 0.25 if args.quick else args.duration
    tune_malloc()
    shapes = {k: v for k, v in _shapes(np.random.default_rng(7)).items() if k in picked}
    with tempfile.TemporaryDirectory(prefix="rlrb") as folder:
        root = Path(folder)
        copy = statistics.median(numpy_copy_gbps(seconds) for _ in range(args.rounds))
        sock = root / "replay.sock"
        proc, url = _server(root / "server", sock, flags=("--durability", args.durability))
        urls = {"tcp": url, "unix": f"unix://{sock}"}
        # the sockets' baselines in the same rounds as rlreplay's figures, one just before and
        # one just after each family's, so that a noisy minute weighs on both sides alike
        base: dict[str, list[float]] = {"tcp": [], "unix": [], "disk": []}
        runs: dict[str, list[dict[tuple[str, str, str], float]]] = {"tcp": [], "unix": []}
        try:
            for r in range(args.rounds):
                base["disk"].append(disk_gbps(root / "server", seconds))
                for family in ("tcp", "unix") if r % 2 == 0 else ("unix", "tcp"):
                    before = socket_gbps(family, root, seconds)
                    runs[family].append(asyncio.run(rlreplay_rates(urls[family], shapes, seconds)))
                    base[family].append((before + socket_gbps(family, root, seconds)) / 2)
        finally:
            stop_process(proc)
        print_table(
            f"Bulk: baselines (GB/s, medians of {args.rounds} rounds; the lowest and highest "
            "round)",
            [
                "NumPy copy of 16 MiB",
                "TCP 127.0.0.1, two processes",
                "Unix socket, two processes",
                "disk: 16 MiB written, fdatasync",
            ],
            [[copy, *(_spread(base[family]) for family in ("tcp", "unix", "disk"))]],
        )
        arms = arm_rows(root, shapes, seconds, args.rounds) if args.arms else None
        item_arms = item_arm_rows(root, shapes, seconds, args.rounds) if args.arms else None
        pushes = push_arm_rows(root, shapes, seconds, args.rounds) if args.arms else None
        zstd = zstd_rows(root, seconds, args.rounds) if args.arms or args.zstd else None
    rows = []
    for name in shapes:
        for op in OPS:
            for layout in ("items", "columns"):
                cells: list[object] = [name, _call_name(op, layout), layout]
                for family in ("tcp", "unix"):
                    got = [run.get((name, op, layout)) for run in runs[family]]
                    if any(g is None for g in got):
                        cells += ["-", "-"]
                        continue
                    gbps = statistics.median(got) / 1e9  # type: ignore[type-var]
                    # each round's figure against the same round's socket
                    ratio = statistics.median(
                        g / 1e9 / b  # type: ignore[operator]
                        for g, b in zip(got, base[family], strict=True)
                    )
                    cells += [gbps, f"{ratio:.2f}x"]
                rows.append(cells)
    print_table(
        "Bulk: rlreplay, GB/s of array bytes and the ratio to the same socket's baseline "
        "(the median of each round's ratio)",
        ["shape", "call", "layout", "TCP GB/s", "/ TCP", "Unix GB/s", "/ Unix"],
        rows,
    )

    if arms is not None:
        print_table(
            "Bulk: columnar reads, GB/s with every fast path on, then each off (on / off)",
            *arms,
        )
    if item_arms is not None:
        print_table("Bulk: reads in the items layout, as the columnar ones above", *item_arms)
    if pushes is not None:
        print_table("Bulk: pushes, GB/s with every fast path on, then each off (on / off)", *pushes)
    if zstd is not None:
        print_table(
            "Bulk: 64 x 16 k tokens (32 k vocabulary) and masks, columns, GB/s of array "
            "bytes with Content-Encoding: zstd on and off (a link this fast favours off)",
            ["call", "socket", "zstd ratio", "zstd on", "zstd off", "on / off"],
            zstd,
        )


if __name__ == "__main__":
    main()
