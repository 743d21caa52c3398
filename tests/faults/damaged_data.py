"""Data directories to damage: an engine pushes in three phases with a checkpoint between
them (so the log has been cut and has several segments), then stops as ``kill -9`` leaves
it or cleanly; helpers damage a copy and start an engine on it."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import msgpack
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.log.framing import BLOCK, LogRecoveryError
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from tests.engine.conftest import crash

MODES = ["memory", "hybrid", "disk"]
PHASES, PUSHES = 3, 6  # pushes of one item each, one flush region each
START_TIMEOUT_S = 60  # a start that takes longer hangs


def settings(data: Path, mode: str, **overrides: Any) -> Settings:
    return Settings(
        data_dir=data,
        storage_mode=mode,  # type: ignore[arg-type]
        io_threads=2,
        wal_writer="thread",
        cache_memory_limit_mb=0.05 if mode == "hybrid" else 64,
        **overrides,
    )


def value_of(key: str) -> bytes:
    return msgpack.packb({"key": key, "pad": key * 40})


async def populate(data: Path, mode: str, stop: str) -> dict[str, bytes]:
    """Push PHASES x PUSHES items, checkpointing between phases; stop as ``stop`` says
    (``kill`` or ``clean``). Returns every answered item."""
    eng = Engine(settings(data, mode))
    await eng.start()
    await eng.create_table("t", TableConfig())
    answered: dict[str, bytes] = {}
    for phase in range(PHASES):
        if phase:
            await eng.flush()  # a checkpoint: the log is cut at the one before
        for i in range(PUSHES):
            key = f"p{phase}-{i}"
            await eng.push("t", [NewItem(key, value_of(key), 1.0)])
            answered[key] = value_of(key)
    if stop == "kill":
        await crash(eng)
    else:
        await eng.stop()
    return answered


_TEMPLATES: dict[tuple[str, str], tuple[Path, dict[str, bytes]]] = {}


def data_dir(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, mode: str, stop: str
) -> tuple[Path, dict[str, bytes]]:
    """A copy of a populated data dir (built once per mode and stop) and its answered items."""
    if (mode, stop) not in _TEMPLATES:
        template = tmp_path_factory.mktemp(f"{mode}-{stop}") / "data"
        _TEMPLATES[mode, stop] = template, asyncio.run(populate(template, mode, stop))
    template, answered = _TEMPLATES[mode, stop]
    data = tmp_path / "data"
    shutil.copytree(template, data)
    return data, dict(answered)


def segments(data: Path) -> list[Path]:
    """The log's segments, oldest first."""
    return sorted((data / "wal").glob("*.wal"), key=lambda p: int(p.stem))


def checkpoint_of(data: Path, mode: str) -> Path:
    return data / ("memory.ckpt" if mode == "memory" else "rocksdb")


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def zero(path: Path, start: int, length: int = BLOCK) -> None:
    data = bytearray(path.read_bytes())
    data[start : start + length] = bytes(length)
    path.write_bytes(bytes(data))


async def refused(data: Path, mode: str, **overrides: Any) -> LogRecoveryError:
    """The start's refusal (it must not hang)."""
    eng = Engine(settings(data, mode, **overrides))
    with pytest.raises(LogRecoveryError) as refusal:
        await asyncio.wait_for(eng.start(), START_TIMEOUT_S)
    return refusal.value


async def started(data: Path, mode: str, **overrides: Any) -> Engine:
    eng = Engine(settings(data, mode, **overrides))
    await asyncio.wait_for(eng.start(), START_TIMEOUT_S)
    return eng


async def values(eng: Engine, keys: list[str]) -> dict[str, bytes | None]:
    got = await eng.get_many("t", keys)
    return {k: (None if it is None else it.value) for k, it in zip(keys, got, strict=True)}


async def assert_everything_back(data: Path, mode: str, answered: dict[str, bytes]) -> None:
    """A start gives every answered item back, with its exact value."""
    eng = await started(data, mode)
    try:
        assert await values(eng, list(answered)) == answered
        assert not eng.storage_stats()["data_lost"]
    finally:
        await eng.stop()
