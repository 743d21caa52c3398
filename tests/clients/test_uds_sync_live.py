"""The synchronous client over a real ``rlreplay serve --uds`` (``Client("unix:///...")``):
its live tests run again here with the socket's URL."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from rlreplay import Client
from tests.clients.test_sync_client_live import (  # noqa: F401  (run again over the socket)
    test_claims_and_rollout_batches_inside_a_running_loop,
    test_three_threads_of_push_and_sample_lose_nothing,
)
from tests.clients.uds_server import live_uds  # noqa: F401  (a fixture)
from tests.live import LiveServer

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def server_url(live_uds: tuple[LiveServer, str]) -> str:  # noqa: F811
    return live_uds[1]


@pytest.fixture
def rb(server_url: str) -> Iterator[Client]:
    with Client(server_url, backoff_s=0.01, max_backoff_s=0.05) as client:
        yield client


def test_the_sync_client_over_the_socket(rb: Client) -> None:
    rb.create_table("sync_uds")
    value = np.arange(4096, dtype=np.float32)
    rb.push("sync_uds", [{"key": "a", "value": {"x": value}}], wait=True)
    item = rb.get("sync_uds", "a")
    assert item is not None
    assert item["value"]["x"].tobytes() == value.tobytes()
    assert rb.health()
