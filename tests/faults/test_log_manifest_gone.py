"""The log's manifest removed: without it a newest segment that is gone too looks like the end
of the log, so a start on a log of format 2 whose segments hold records refuses, naming it;
a log whose only segment holds its header alone (a clean stop) has lost nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.faults.damaged_data import (
    MODES,
    assert_everything_back,
    data_dir,
    refused,
    remove,
    segments,
    started,
)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("newest_too", [False, True], ids=["manifest", "manifest-and-newest"])
def test_a_removed_manifest_refuses_the_start_after_a_crash(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, mode: str, newest_too: bool
) -> None:
    data, _ = data_dir(tmp_path_factory, tmp_path, mode, "kill")
    manifest = data / "wal" / "MANIFEST"
    remove(manifest)
    if newest_too:
        remove(segments(data)[-1])

    async def run() -> None:
        refusal = await refused(data, mode)
        assert refusal.kind == "log_missing"
        assert str(manifest) in str(refusal) and "is missing" in str(refusal)
        assert "--accept-data-loss" in str(refusal)

    asyncio.run(run())


@pytest.mark.parametrize("mode", MODES)
def test_a_removed_manifest_after_a_clean_stop_loses_nothing(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, mode: str
) -> None:
    data, answered = data_dir(tmp_path_factory, tmp_path, mode, "clean")
    remove(data / "wal" / "MANIFEST")
    asyncio.run(assert_everything_back(data, mode, answered))


def test_accepting_the_loss_starts_and_writes_a_manifest_again(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    data, answered = data_dir(tmp_path_factory, tmp_path, "hybrid", "kill")
    remove(data / "wal" / "MANIFEST")

    async def run() -> None:
        eng = await started(data, "hybrid", accept_data_loss=True)
        await eng.stop()
        assert (data / "wal" / "MANIFEST").exists()

    asyncio.run(run())
    asyncio.run(assert_everything_back(data, "hybrid", answered))
