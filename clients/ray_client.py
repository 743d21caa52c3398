"""A synchronous sharded client found by the name of a Ray deployment of replay servers.

:class:`RayClient` is a :class:`~rlreplay.clients.sync_sharded.ShardedClient` whose servers
come from the deployment's registry (:mod:`rlreplay.clients.ray_registry`), hashed by their
names (``<name>-<i>``), not their URLs, so a server Ray restarted on another port still owns
the same keys. It pickles as its name: a copy sent to a Ray task or actor asks the registry
for the servers' current addresses there and opens its own connections.
"""

from __future__ import annotations

from typing import Any

import ray

from rlreplay.clients.ray_launcher import find_registry
from rlreplay.clients.sharded import ShardedReplayClient
from rlreplay.clients.sync_sharded import ShardedClient

__all__ = ["RayClient", "async_client", "shards"]


def shards(name: str, namespace: str | None = None, *, timeout_s: float = 60.0) -> dict[str, Any]:
    """Deployment ``name``'s ``urls``, ``shard_names`` and ``api_key``, now.

    Raises:
        ValueError: No deployment of that name.
    """
    registry = find_registry(name, namespace)
    answer: dict[str, Any] = ray.get(registry.shards.remote(), timeout=timeout_s)
    return answer


def async_client(name: str, *, namespace: str | None = None, **options: Any) -> ShardedReplayClient:
    """A :class:`ShardedReplayClient` of deployment ``name`` (asks the registry, blocking,
    once; make it where its event loop runs). ``options`` are ``ShardedReplayClient``'s."""
    found = shards(name, namespace)
    return ShardedReplayClient(
        found["urls"], found["api_key"], shard_names=found["shard_names"], **options
    )


def _reopen(name: str, namespace: str | None, options: dict[str, Any]) -> RayClient:
    return RayClient(name, namespace=namespace, **options)


class RayClient(ShardedClient):
    """A :class:`ShardedClient` of the replay servers of Ray deployment ``name``.

    Args:
        name: The deployment's name (:func:`rlreplay.ray.start`'s).
        namespace: Its Ray namespace (the job's when None).
        **options: ``ShardedClient``'s (``allow_partial``, ``timeout_s``, ``retries``...).

    Raises:
        ValueError: No deployment of that name.
    """

    def __init__(self, name: str, *, namespace: str | None = None, **options: Any) -> None:
        found = shards(name, namespace)
        super().__init__(
            found["urls"], found["api_key"], shard_names=found["shard_names"], **options
        )
        self.name = name
        self._namespace = namespace
        self._options = options

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its name: unpickling asks the registry again (and reconnects)."""
        return (_reopen, (self.name, self._namespace, self._options))
