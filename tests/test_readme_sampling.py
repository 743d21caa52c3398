"""What the README's Concepts say about sampling holds: draws are with replacement, and a
sample from an empty table waits for its timeout, then fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from rlreplay.wire.errors import DeadlineExceeded
from tests.engine.conftest import make_settings

README = Path(__file__).resolve().parents[1] / "README.md"


def concepts() -> str:
    text = README.read_text()
    return text[text.index("## Concepts") :].split("\n## ", 1)[0]


def test_the_readme_says_sampling_is_with_replacement_and_waits_on_an_empty_table() -> None:
    text = " ".join(concepts().split())
    assert "with replacement" in text
    assert "empty table waits" in text and "`timeout_ms`" in text and "504" in text


@pytest.mark.parametrize("sampler", ["uniform", "fifo"])
async def test_a_batch_bigger_than_the_table_repeats_items(tmp_path: Path, sampler: str) -> None:
    engine = Engine(make_settings(tmp_path, storage_mode="memory", durability="none"))
    await engine.start()
    try:
        await engine.create_table("t", TableConfig.model_validate({"sampler": {"type": sampler}}))
        await engine.push("t", [NewItem(f"k{i}", b"\x01") for i in range(3)], wait=True)
        picks = [item.key for item in await engine.sample("t", 8)]
        assert len(picks) == 8 and set(picks) <= {"k0", "k1", "k2"}
        await engine.create_table("empty", TableConfig())
        with pytest.raises(DeadlineExceeded, match="no item to sample"):
            await engine.sample("empty", 2, timeout_s=0.2)
    finally:
        await engine.stop()
