"""Replay servers as Ray actors, and clients of them by name (``pip install 'rlreplay[ray]'``).

::

    import ray, rlreplay.ray

    ray.init()
    rlreplay.ray.start("replay", resource="replay_node", backup_url="s3://bucket/replay")
    rb = rlreplay.ray.client("replay")          # in the driver or any task or actor
    rb.create_table("transitions", sampler={"type": "uniform"})

    @ray.remote
    def actor_loop(rb):                        # a client pickles as its name
        rb.push("transitions", [...])

    rlreplay.ray.shutdown("replay")            # final snapshots, then SIGTERM

See docs/use-from.md. Not loaded by ``import rlreplay``: it imports Ray.
"""

from __future__ import annotations

from rlreplay.clients.ray_client import RayClient, async_client, shards
from rlreplay.clients.ray_launcher import NotEnoughResources, find_registry, shutdown, start

__all__ = [
    "NotEnoughResources",
    "RayClient",
    "async_client",
    "client",
    "find_registry",
    "servers",
    "shards",
    "shutdown",
    "start",
]


def client(name: str, *, namespace: str | None = None, **options: object) -> RayClient:
    """A synchronous sharded client of deployment ``name`` (:class:`RayClient`)."""
    return RayClient(name, namespace=namespace, **options)


def servers(name: str, *, namespace: str | None = None) -> list[dict[str, object]]:
    """Each server's ``info()`` now: URL, node id, data directory, pids, restarted."""
    import ray

    registry = find_registry(name, namespace)
    handles = ray.get(registry.servers.remote(), timeout=60)
    return list(ray.get([h.info.remote() for h in handles], timeout=60))
