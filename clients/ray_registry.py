"""The registry of a Ray deployment of replay servers: a named, detached actor.

It holds each server's current address (each start of a server actor registers it, so after
Ray restarts one the registry points at the new address), the servers' actor handles and
how they were started. Any worker of the job finds it by name
(``ray.get_actor("rlreplay:<name>", namespace=...)``); :func:`rlreplay.ray.client` builds a
client from what it answers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ReplayRegistry", "registry_name"]


def registry_name(name: str) -> str:
    """The Ray actor name of deployment ``name``'s registry."""
    return f"rlreplay:{name}"


class ReplayRegistry:
    """The body of the registry actor (wrapped by ``ray.remote`` in the launcher).

    Args:
        name: The deployment's name.
        size: How many servers it has.
        api_key: The key the servers were started with, handed to clients (or None).
    """

    def __init__(self, name: str, size: int, api_key: str | None) -> None:
        self._name = name
        self._size = size
        self._api_key = api_key
        self._urls: dict[int, str] = {}
        self._nodes: dict[int, str] = {}
        self._starts: dict[int, int] = {}
        self._servers: list[Any] = []

    def register(self, index: int, url: str, node_id: str) -> int:
        """Record server ``index``'s address (at each of its starts).

        Returns:
            How many times server ``index`` has started.
        """
        if not 0 <= index < self._size:
            raise ValueError(f"index ({index}) must be in [0, {self._size})")
        self._urls[index] = url
        self._nodes[index] = node_id
        self._starts[index] = self._starts.get(index, 0) + 1
        return self._starts[index]

    def set_servers(self, servers: list[Any]) -> None:
        """Keep the server actors' handles, so :func:`rlreplay.ray.shutdown` finds them."""
        self._servers = list(servers)

    def servers(self) -> list[Any]:
        """The server actors' handles, by index."""
        return list(self._servers)

    def shards(self) -> dict[str, Any]:
        """What a client needs: ``urls`` and ``shard_names`` by index, and ``api_key``.

        Raises:
            RuntimeError: A server has not registered yet.
        """
        missing = [i for i in range(self._size) if i not in self._urls]
        if missing:
            raise RuntimeError(f"replay deployment {self._name!r}: servers {missing} not up")
        return {
            "urls": [self._urls[i] for i in range(self._size)],
            "shard_names": [f"{self._name}-{i}" for i in range(self._size)],
            "api_key": self._api_key,
        }

    def placement(self) -> dict[str, Any]:
        """Each server's node id and how many times it started, by index."""
        return {
            "node_ids": [self._nodes.get(i) for i in range(self._size)],
            "starts": [self._starts.get(i, 0) for i in range(self._size)],
        }
