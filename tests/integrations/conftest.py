"""Fixtures of the integration tests: a local multi-node Ray cluster, every node on 127.0.0.1.

Ray's cluster utilities start each "node" as a raylet of its own on this machine. Ray binds
the machine's outward address unless told that clusters are off for this platform, in which
case it uses loopback (as its own tests do on macOS): the variable is set before any node
starts, and the workers inherit it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

#: Custom resource that marks the nodes meant for replay servers.
REPLAY = "replay_node"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A head (1 CPU, for the test's tasks) and three replay nodes (1 CPU, ``replay_node``)."""
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "include_dashboard": False},
        )
        try:
            for _ in range(3):
                cluster.add_node(num_cpus=1, resources={REPLAY: 1})
            ray.init(address=cluster.address, log_to_driver=False, namespace="rlreplay-tests")
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()
