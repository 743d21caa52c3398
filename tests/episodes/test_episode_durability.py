"""Episode tables are durable like pushes: kill -9 of a real ``rlreplay serve`` while 4
writers append loses no answered step, in every storage mode (with checkpoints cutting the
log on the way); a restart after a clean stop, checkpoints and deletes brings back what was
applied; a snapshot restores every episode."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from rlreplay.app.engine.engine import Engine
from rlreplay.app.main import create_app
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.wire.codec import packb, unpackb
from rlreplay.wire.errors import ItemNotFound
from tests.live import start_server, stop_server

MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}
WRITERS, APPENDS, K = 4, 40, 6


def chunk(writer: int, i: int) -> dict[str, np.ndarray]:
    """The steps writer ``writer`` appends in its ``i``-th append (known to the checker)."""
    rng = np.random.default_rng(1000 * writer + i)
    return {
        "obs": rng.integers(0, 4, size=(K, 32, 32), dtype=np.uint8),
        "reward": rng.random(K).astype(np.float32),
    }


def writer_loop(url: str, writer: int, answered: list[int], stop: threading.Event) -> None:
    """Append to episode ``w<writer>`` until stopped; ``answered[writer]``: appends answered."""
    with httpx.Client(base_url=url, timeout=10) as client:
        for i in range(APPENDS):
            if stop.is_set():
                return
            body = packb({"start": i * K, "steps": chunk(writer, i)})
            try:
                r = client.post(f"/v1/tables/eps/episodes/w{writer}/steps", content=body,
                                headers=MSGPACK)  # fmt: skip
            except httpx.HTTPError:
                return
            if r.status_code != 202:
                return
            answered[writer] = i + 1


@pytest.mark.parametrize("mode", ["hybrid", "memory", "disk"])
def test_kill9_during_appends_loses_no_answered_step(tmp_path: Path, mode: str) -> None:
    flags = ("--storage-mode", mode, "--wal-checkpoint-mb", "0.25")
    server = start_server(tmp_path, *flags)
    answered = [0] * WRITERS
    stop = threading.Event()
    try:
        config = {"episodes": {"compression": "zstd"}}
        assert httpx.put(f"{server.url}/v1/tables/eps", json=config).status_code == 201
        threads = [
            threading.Thread(target=writer_loop, args=(server.url, w, answered, stop))
            for w in range(WRITERS)
        ]
        for t in threads:
            t.start()
        deadline = threading.Event()
        while sum(answered) < WRITERS * APPENDS // 2 and not deadline.wait(0.05):
            if not any(t.is_alive() for t in threads):
                break
        server.process.kill()  # kill -9 while the writers append
        server.process.wait(timeout=30)
        stop.set()
        for t in threads:
            t.join(timeout=30)
    finally:
        stop.set()
        if server.process.poll() is None:
            server.process.kill()
    assert sum(answered) >= WRITERS * APPENDS // 2 or sum(answered) == WRITERS * APPENDS
    server = start_server(tmp_path, *flags, data_dir=server.data_dir)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for w in range(WRITERS):
                r = client.get(f"/v1/tables/eps/episodes/w{w}", headers=MSGPACK)
                if answered[w] == 0:
                    continue
                assert r.status_code == 200, r.text
                got = unpackb(r.content)
                assert got["length"] >= answered[w] * K
                for i in range(answered[w]):
                    want = chunk(w, i)
                    for f, a in want.items():
                        np.testing.assert_array_equal(got["steps"][f][i * K : (i + 1) * K], a)
    finally:
        stop_server(server)


async def _run(settings: Settings, work: Any) -> Any:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await work(client, app.state.engine)


@pytest.mark.parametrize("mode", ["hybrid", "memory", "disk"])
async def test_restart_after_checkpoints_and_deletes(tmp_path: Path, mode: str) -> None:
    settings = Settings(data_dir=tmp_path / "data", storage_mode=mode)
    rng = np.random.default_rng(9)
    data = {n: rng.integers(0, 9, size=(n * 37 + 5, 16), dtype=np.uint8) for n in range(1, 5)}

    async def write(client: httpx.AsyncClient, engine: Any) -> None:
        r = await client.put("/v1/tables/eps", json={"episodes": {"compression": "zstd"}})
        assert r.status_code == 201
        for n, obs in data.items():
            half = len(obs) // 2
            for start, stop in ((0, half), (half, len(obs))):
                body: dict[str, Any] = {"start": start, "steps": {"obs": obs[start:stop]}}
                if n % 2 and stop == len(obs):
                    body["end"] = {"reason": "terminated", "final": {"obs": obs[0]}}
                r = await client.post(f"/v1/tables/eps/episodes/e{n}/steps",
                                      content=packb(body), headers=MSGPACK)  # fmt: skip
                assert r.status_code == 202
            await engine.flush()  # a checkpoint between episodes (the log is cut)
        assert (await client.delete("/v1/tables/eps/episodes/e2")).status_code == 202
        await engine.flush()

    async def check(client: httpx.AsyncClient, engine: Any) -> None:
        assert (await client.get("/v1/tables/eps/episodes/e2")).status_code == 404
        for n in (1, 3, 4):
            r = await client.get(f"/v1/tables/eps/episodes/e{n}", headers=MSGPACK)
            got = unpackb(r.content)
            np.testing.assert_array_equal(got["steps"]["obs"], data[n])
            assert got["end"] == ("terminated" if n % 2 else None)
            if n % 2:
                np.testing.assert_array_equal(got["final"]["obs"], data[n][0])
        stats = (await client.get("/v1/tables/eps")).json()["stats"]
        assert stats["episodes"] == 3
        assert stats["steps"] == sum(len(data[n]) for n in (1, 3, 4))
        # open episodes take appends again where they stopped
        body = {"start": len(data[4]), "steps": {"obs": data[4][:2]}, "wait": True}
        r = await client.post("/v1/tables/eps/episodes/e4/steps", content=packb(body),
                              headers=MSGPACK)  # fmt: skip
        assert r.status_code == 200

    await _run(settings, write)
    await _run(settings, check)


@pytest.mark.parametrize("mode", ["hybrid", "disk", "memory"])
async def test_a_snapshot_restores_every_episode(tmp_path: Path, mode: str) -> None:
    url = f"file://{tmp_path / 'backups'}"
    rng = np.random.default_rng(11)
    data = {f"s{n}": rng.random((n * 50 + 3, 5)).astype(np.float32) for n in range(6)}
    common = {"storage_mode": mode, "backup_url": url, "backup_interval_s": 0}
    engine = Engine(Settings(data_dir=tmp_path / "a", **common))
    await engine.start()
    try:
        await engine.create_table("eps", TableConfig.model_validate({"episodes": {}}))
        for name, obs in data.items():
            end = "truncated" if name != "s5" else None
            await engine.episodes.append("eps", name, start=0, steps={"obs": obs}, end=end)
        await engine.take_snapshot()
        # after the snapshot: not in it
        await engine.episodes.append("eps", "late", start=0, steps={"obs": data["s1"]})
    finally:
        await engine.stop()
    restored = Engine(
        Settings(data_dir=tmp_path / "b", restore="latest", default_table=False, **common)
    )
    await restored.start()
    try:
        for name, obs in data.items():
            got = await restored.episodes.read("eps", name)
            np.testing.assert_array_equal(got.steps["obs"], obs)
            assert got.end == ("truncated" if name != "s5" else None)
        with pytest.raises(ItemNotFound):
            await restored.episodes.read("eps", "late")
    finally:
        await restored.stop()
