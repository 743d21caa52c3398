"""``Content-Encoding: zstd`` over a real ``rlreplay serve --zstd``, on TCP and on the Unix
socket: compressible batches round-trip bit-exactly both ways, the answers are compressed
only when asked, and a server without ``--zstd`` answers as it always did."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from rlreplay import ReplayClient
from rlreplay.wire.codec import packb
from rlreplay.wire.compression import compress
from tests.live import running_server

pytest.importorskip("fastapi")
pytest.importorskip("zstandard")

N = 32
MSGPACK = "application/msgpack"


@pytest.fixture(scope="module")
def zstd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(TCP URL, socket URL) of a server run with --zstd."""
    with tempfile.TemporaryDirectory(prefix="rlz") as folder:
        sock = Path(folder) / "replay.sock"
        workdir = tmp_path_factory.mktemp("zstd")
        with running_server(workdir, "--uds", str(sock), "--zstd") as server:
            yield server.url, f"unix://{sock}"


@pytest.fixture(params=["tcp", "unix"])
async def rb(
    request: pytest.FixtureRequest, zstd_server: tuple[str, str]
) -> AsyncIterator[ReplayClient]:
    url = zstd_server[0] if request.param == "tcp" else zstd_server[1]
    async with ReplayClient(url, compression="zstd", backoff_s=0.01) as client:
        yield client


def _columns(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "tokens": rng.integers(0, 300, (N, 4096), dtype=np.int32),  # a small vocabulary
        "mask": (rng.random((N, 4096)) < 0.9).astype(np.uint8),
        "logp": rng.standard_normal((N, 16)).astype(">f4"),
    }


async def test_compressible_batches_round_trip_bit_exactly(
    rb: ReplayClient, request: pytest.FixtureRequest
) -> None:
    table = "z_" + request.node.callspec.id
    await rb.create_table(table)
    columns = _columns(1)
    keys = [f"k{i}" for i in range(N)]
    await rb.push_columns(table, keys, columns, wait=True)  # a compressed request body
    batch = await rb.get_many(table, keys, layout="columns")
    for name, want in columns.items():
        got = batch[name]
        assert isinstance(got, np.ndarray)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    sampled = await rb.sample(table, N, layout="columns")
    assert sampled["tokens"].shape == (N, 4096)
    items = await rb.get_many(table, keys[:3])
    assert (
        items[0] is not None and items[0]["value"]["mask"].tobytes() == columns["mask"][0].tobytes()
    )


async def test_answers_are_compressed_only_when_asked(zstd_server: tuple[str, str]) -> None:
    url = zstd_server[0]
    async with ReplayClient(url) as rb:
        await rb.create_table("z_raw")
        keys = [f"k{i}" for i in range(N)]
        await rb.push_columns("z_raw", keys, _columns(2), wait=True)
    body = packb({"keys": keys, "layout": "columns"})
    path = f"{url}/v1/tables/z_raw/items:batchGet"
    async with httpx.AsyncClient() as http:
        plain = await http.post(
            path, content=body, headers={"content-type": MSGPACK, "accept-encoding": "identity"}
        )
        asked = await http.post(
            path,
            content=compress([body]),
            headers={
                "content-type": MSGPACK,
                "content-encoding": "zstd",
                "accept-encoding": "zstd",
            },
        )
    assert "content-encoding" not in plain.headers
    assert asked.headers["content-encoding"] == "zstd"
    assert int(asked.headers["content-length"]) < len(plain.content) // 2
    assert asked.content == plain.content  # httpx decodes it: the same bytes


def test_a_server_without_zstd_answers_uncompressed(tmp_path: Path) -> None:
    with running_server(tmp_path) as server:
        keys = ["a"]
        with httpx.Client(base_url=server.url) as http:
            r = http.post(
                "/v1/tables/default/items:batchGet",
                content=packb({"keys": keys}),
                headers={"content-type": MSGPACK, "accept-encoding": "zstd"},
            )
        assert r.status_code == 200 and "content-encoding" not in r.headers
        assert r.json()["items"] == [None]
