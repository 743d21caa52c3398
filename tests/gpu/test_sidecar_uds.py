"""A real ``rlreplay sidecar --server unix:///...`` following a server on its Unix socket."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch  # noqa: F401  (the sidecar needs it: skipped where conftest skips gpu tests)

from tests.gpu.test_sampler import value_of
from tests.gpu.test_sidecar_live import call, get, running_sidecar, sample, wait_for
from tests.live import running_server


def test_the_sidecar_follows_a_server_over_its_unix_socket(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="rlr") as folder:
        sock = Path(folder) / "replay.sock"
        flags = ("--storage-mode", "memory", "--durability", "none", "--uds", str(sock))
        with running_server(tmp_path / "server", *flags) as server:
            call(server.url, "PUT", "/v1/tables/t", {})
            pushed = {f"s{i}": value_of(i) for i in range(8)}
            items = [{"key": k, "value": v} for k, v in pushed.items()]
            call(server.url, "POST", "/v1/tables/t/items", {"items": items, "wait": True})
            with running_sidecar(tmp_path, f"unix://{sock}", "t") as sidecar:
                wait_for(lambda: get(sidecar, "/readyz").status_code == 200, what="readyz")
                batch = sample(sidecar, 16, "uniform", ["obs"])
                for row, key in enumerate(batch["keys"]):
                    np.testing.assert_array_equal(batch["columns"]["obs"][row], pushed[key]["obs"])
