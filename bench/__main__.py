"""``python -m bench [section ...] [--quick]``: run the benchmark sections and print their tables.

Sections: engine (storage and writer), selection (samplers vs TorchRL), http (the
service vs the framework's ceiling), fast_paths (each hand-written fast path on and off),
metrics (a /metrics scrape's cost by table count), snapshots (taking, restoring, push pauses),
client (one Python client process vs wrk, codec costs, push latency), sync_client (the
synchronous Client next to the async ReplayClient),
sharded (the sharded client over 1, 2 and 3 local servers), sidecar (the GPU
sidecar's selection, collection, feed cost and trainer batches/s), rollouts (claim
+ ack next to sample, patch next to push), bulk (big batches over TCP and a Unix socket
next to the sockets' own bandwidth), ingest (sustained pushes with and without checkpoints:
the event loop's stalls, recovery after kill -9), episodes (windows and n-step transitions
of Atari-sized frames next to Reverb and TorchRL), ray_path (rlreplay.ray's client, in the
driver and in a Ray task, next to a plain client; start and shutdown).
With no section named, all run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys

SECTIONS = (
    "engine",
    "selection",
    "http",
    "fast_paths",
    "metrics",
    "snapshots",
    "client",
    "sync_client",
    "sharded",
    "sidecar",
    "rollouts",
    "rollout_filters",
    "bulk",
    "ingest",
    "episodes",
    "ray_path",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("sections", nargs="*", help=f"sections to run: {', '.join(SECTIONS)}")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    args = parser.parse_args(argv)
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    print(
        f"# rlreplay benchmarks — {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}"
    )
    for name in args.sections or SECTIONS:
        module = importlib.import_module(f"bench.{name}")
        module.main(["--quick"] if args.quick else [])
        sys.stdout.flush()


if __name__ == "__main__":
    main()
