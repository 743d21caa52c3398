"""Replay servers as Ray actors: collectors push from Ray tasks, a learner actor samples.

``rlreplay.ray.start`` places one replay server per node (here, the one node of a local Ray,
unless ``--address`` names a cluster) and a registry actor; each collector task gets the
client pickled, which reconnects in the task's process by the deployment's name; the
learner actor samples and updates priorities. ``rlreplay.ray.shutdown`` stops the servers
(a final snapshot first when ``--backup-url`` is given).

Prints one JSON line: where the servers ran, what was pushed and sampled.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from typing import Any

import numpy as np
import ray

import rlreplay.ray

TABLE = "transitions"


@ray.remote(num_cpus=0)
def collect(rb: rlreplay.ray.RayClient, worker: int, items: int) -> int:
    """A collector: pushes ``items`` transitions, 64 at a time, through the client it got."""
    rng = np.random.default_rng(worker)
    pushed = 0
    for start in range(0, items, 64):
        count = min(64, items - start)
        keys = [f"w{worker}-{start + i}" for i in range(count)]
        columns = {
            "obs": rng.standard_normal((count, 4), dtype=np.float32),
            "reward": rng.standard_normal(count),
        }
        pushed += rb.push_columns(TABLE, keys, columns)
    return pushed


@ray.remote(num_cpus=0)
class Learner:
    """Samples batches by the deployment's name and sets new priorities."""

    def __init__(self, name: str) -> None:
        self.rb = rlreplay.ray.client(name)

    def train(self, steps: int, batch_size: int) -> dict[str, Any]:
        seen: set[str] = set()
        for _ in range(steps):
            batch = self.rb.sample(TABLE, batch_size, layout="columns")
            seen.update(batch.keys)
            td_error = np.abs(batch["reward"]) + 1e-3  # stands in for a loss's TD errors
            self.rb.update_priorities(TABLE, dict(zip(batch.keys, td_error.tolist(), strict=True)))
        return {"batches": steps, "distinct_items_seen": len(seen)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="a Ray cluster (a local one if none)")
    parser.add_argument("--name", default="replay", help="the deployment's name")
    parser.add_argument("--collectors", type=int, default=2)
    parser.add_argument("--items", type=int, default=2_000, help="items each collector pushes")
    parser.add_argument("--steps", type=int, default=50, help="learner batches")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--backup-url", default=None, help="a prefix for the servers' snapshots")
    args = parser.parse_args()
    if args.address:
        ray.init(address=args.address, namespace="rlreplay-example", log_to_driver=False)
    else:
        ray.init(
            num_cpus=2, namespace="rlreplay-example", include_dashboard=False, log_to_driver=False
        )
    try:
        servers = rlreplay.ray.start(
            args.name,
            num_cpus=0.5,
            memory_mb=256,
            data_root=tempfile.mkdtemp(prefix="rlreplay-ray-example-"),
            backup_url=args.backup_url,
            serve_flags=["--no-default-table"],
        )
        try:
            rb = rlreplay.ray.client(args.name)
            rb.create_table(TABLE, sampler={"type": "prioritized", "exponent": 0.6})
            pushed = sum(
                ray.get([collect.remote(rb, w, args.items) for w in range(args.collectors)])
            )
            learner = Learner.remote(args.name)
            trained = ray.get(learner.train.remote(args.steps, args.batch_size))
            size = rb.describe_table(TABLE)["stats"]["size"]
            rb.close()
        finally:
            stopped = rlreplay.ray.shutdown(args.name)
    finally:
        ray.shutdown()
    print(
        json.dumps(
            {
                "servers": [{"url": s["url"], "node_id": s["node_id"][:8]} for s in servers],
                "pushed": pushed,
                "table_size": size,
                **trained,
                "stopped_cleanly": all(s.get("clean") for s in stopped),
            }
        )
    )


if __name__ == "__main__":
    main()
