"""A snapshot keeps a rollout table's state: a restore brings back groups, versions,
patched fields, acknowledgements, the policy version and the request ids."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import msgpack
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem
from tests.engine.conftest import make_settings


@pytest.fixture
def memory_url() -> Iterator[str]:
    url = f"memory://rollouts-{uuid.uuid4().hex}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


@pytest.mark.parametrize("mode", ["hybrid", "disk", "memory"])
async def test_a_restored_snapshot_keeps_acks_versions_and_request_ids(
    tmp_path: Path, memory_url: str, mode: str
) -> None:
    common = {"storage_mode": mode, "backup_url": memory_url, "backup_interval_s": 0}
    engine = Engine(make_settings(tmp_path / "a", **common))
    await engine.start()
    try:
        await engine.create_table("r", TableConfig.model_validate({"max_staleness": 5}))
        items = [NewItem(f"k{i}", msgpack.packb({"p": i}), 1.0, f"g{i // 2}", 1) for i in range(4)]
        await engine.push("r", items, request_id="push-1")
        await engine.patch("r", [(f"k{i}", msgpack.packb({"reward": i})) for i in range(4)])
        lease, _ = await engine.claim("r", "trainer", 2, fields=["reward"])
        assert lease is not None
        await engine.ack("r", lease.id)
        await engine.set_version("r", 3)
        await engine.take_snapshot()
    finally:
        await engine.stop()
    restored = Engine(
        make_settings(tmp_path / "b", **common, restore="latest", default_table=False)
    )
    await restored.start()
    try:
        got = await restored.get("r", "k3")
        assert got is not None and msgpack.unpackb(got.value) == {"p": 3, "reward": 3}
        assert (got.group, got.version) == ("g1", 1)
        assert restored.tasks("r")["version"] == 3
        _, handed = await restored.claim("r", "trainer", 4, wait_ms=0, partial=True)
        assert [it.key for it in handed] == ["k2", "k3"]  # k0 and k1 were acknowledged
        # the push's request id came back too: a retry changes nothing
        await restored.push("r", [NewItem("k0", msgpack.packb("new"))], request_id="push-1")
        again = await restored.get("r", "k0")
        assert again is not None and msgpack.unpackb(again.value) == {"p": 0, "reward": 0}
    finally:
        await restored.stop()
