"""Replay servers as Ray actors: :func:`start`, :func:`shutdown` (``rlreplay.ray``).

:func:`start` checks the cluster first (its nodes' total and free resources), so a cluster
that cannot hold the servers asked for is refused at once with :class:`NotEnoughResources`
naming what is missing, rather than left pending. It then places one
:class:`~rlreplay.clients.ray_server.ReplayServerActor` per chosen node by hard node
affinity (``NodeAffinitySchedulingStrategy(soft=False)``), each declaring its CPUs, memory
and, when asked, a custom resource, and a named, detached
:class:`~rlreplay.clients.ray_registry.ReplayRegistry` that the servers tell their address.
Ray restarts a server actor whose process dies (``max_restarts``) on the same node, where it
finds its data directory.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlreplay.clients.ray_registry import ReplayRegistry, registry_name
from rlreplay.clients.ray_server import ReplayServerActor

__all__ = ["NotEnoughResources", "find_registry", "shutdown", "start"]

_MiB = 1024 * 1024


class NotEnoughResources(RuntimeError):
    """The Ray cluster cannot place the replay servers asked for (the message says why)."""


def find_registry(name: str, namespace: str | None = None) -> Any:
    """The registry actor of deployment ``name``.

    Raises:
        ValueError: No deployment of that name in the namespace.
        RuntimeError: This process is not connected to Ray (rather than start a new,
            empty local Ray, as Ray's calls would).
    """
    if not ray.is_initialized():
        raise RuntimeError(
            f"looking for replay deployment {name!r}: connect to its Ray cluster first "
            "(ray.init(address=...))"
        )
    try:
        return ray.get_actor(registry_name(name), namespace=namespace)
    except ValueError as exc:
        raise ValueError(
            f"no replay deployment {name!r} in Ray namespace {namespace!r} "
            "(rlreplay.ray.start starts one)"
        ) from exc


def _pick_nodes(
    n: int | None, resource: str | None, per_server: dict[str, float]
) -> list[dict[str, Any]]:
    """The nodes to place the servers on: alive, carrying ``resource`` when named, each
    with ``per_server`` free. Raises :class:`NotEnoughResources` when too few are."""
    alive = [node for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]
    carrying = [node for node in alive if not resource or node["Resources"].get(resource, 0) > 0]
    where = f"nodes carrying resource {resource!r}" if resource else "alive nodes"
    if not carrying or (n is not None and len(carrying) < n):
        raise NotEnoughResources(
            f"asked for {n or 'one server per node'} replay servers, one per node, but the "
            f"cluster has {len(carrying)} {where} (of {len(alive)} alive)"
        )
    free = _free_per_node()
    fits: list[tuple[dict[str, Any], dict[str, Any]]] = []
    short: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for node in carrying:
        total, now = node["Resources"], free.get(node["NodeID"], node["Resources"])
        lacking = {
            key: (amount, total.get(key, 0.0), now.get(key, 0.0))
            for key, amount in per_server.items()
            if now.get(key, 0.0) + 1e-9 < amount
        }
        (short if lacking else fits).append((node, lacking))
    wanted = len(carrying) if n is None else n
    if len(fits) < wanted:
        reasons = "; ".join(
            f"node {node['NodeID'][:8]}: "
            + ", ".join(
                f"{k} needs {a:g}, has {f:g} free of {t:g}" for k, (a, t, f) in lack.items()
            )
            for node, lack in short
        )
        raise NotEnoughResources(
            f"asked for {wanted} replay servers, each needing "
            f"{', '.join(f'{k}={v:g}' for k, v in per_server.items())}; only {len(fits)} of "
            f"the {len(carrying)} {where} can hold one ({reasons})"
        )
    return [node for node, _ in fits[:wanted]]


def _free_per_node() -> dict[str, dict[str, float]]:
    """Each node's free resources, as the GCS last heard (empty when unknown)."""
    try:
        from ray._private.state import state

        return dict(state.available_resources_per_node())  # type: ignore[no-untyped-call]
    except (ImportError, AttributeError, RuntimeError):  # a private API: the totals alone
        return {}


def start(
    name: str,
    n: int | None = None,
    *,
    resource: str | None = None,
    resource_per_server: float = 1.0,
    num_cpus: float = 1.0,
    memory_mb: float = 1024,
    data_root: str | None = None,
    backup_url: str | None = None,
    host: str | None = None,
    api_key: str | None = None,
    serve_flags: Sequence[str] = (),
    max_restarts: int = 5,
    namespace: str | None = None,
    ready_timeout_s: float = 120.0,
) -> list[dict[str, Any]]:
    """Start replay servers as Ray actors, one per node, and their registry.

    Call it from a Ray driver (``ray.init`` done). Clients come from
    :func:`rlreplay.ray.client` by ``name``, in any worker of the job.

    Args:
        name: The deployment's name (the registry actor is ``rlreplay:<name>``).
        n: How many servers; one per eligible node when None.
        resource: Place servers only on nodes carrying this custom resource, and
            reserve ``resource_per_server`` of it for each.
        resource_per_server: How much of ``resource`` each server reserves.
        num_cpus: CPUs each server actor reserves.
        memory_mb: Memory each server actor reserves (Ray's ``memory`` resource).
        data_root: The node-local folder for the servers' data directories
            (``<data_root>/<name>-<i>``); the system's temporary folder's ``rlreplay-ray``
            when None.
        backup_url: A prefix: server ``i`` snapshots to ``<backup_url>/<name>-<i>`` and a
            restarted one restores from there (``--restore latest``) when its data
            directory is empty.
        host: The address servers bind; each node's address when None (``0.0.0.0`` only
            when you pass it).
        api_key: The servers' bearer key, handed to the clients by the registry.
        serve_flags: More ``rlreplay serve`` flags for every server.
        max_restarts: How often Ray restarts a server actor whose process died.
        namespace: The Ray namespace of the named actors (the job's when None).
        ready_timeout_s: How long each server may take to answer ``/readyz``.

    Returns:
        Each server's :meth:`~rlreplay.clients.ray_server.ReplayServerActor.info`.

    Raises:
        NotEnoughResources: The cluster cannot place the servers (raised before any
            actor is created).
        ValueError: A deployment of that name runs already, or a bad argument.
        RuntimeError: A server did not start; everything started is stopped again.
    """
    if n is not None and n < 1:
        raise ValueError(f"n ({n}) must be >= 1")
    if not ray.is_initialized():
        raise RuntimeError("rlreplay.ray.start needs a Ray driver: call ray.init() first")
    try:
        ray.get_actor(registry_name(name), namespace=namespace)
    except ValueError:
        pass
    else:
        raise ValueError(f"replay deployment {name!r} runs already (rlreplay.ray.shutdown)")
    per_server = {"CPU": float(num_cpus), "memory": float(memory_mb) * _MiB}
    if resource:
        per_server[resource] = float(resource_per_server)
    nodes = _pick_nodes(n, resource, {k: v for k, v in per_server.items() if v > 0})
    registry: Any = (
        ray.remote(ReplayRegistry)
        .options(name=registry_name(name), namespace=namespace, lifetime="detached", num_cpus=0)
        .remote(name, len(nodes), api_key)
    )
    flags = [*serve_flags, *(["--api-key", api_key] if api_key else [])]
    root = data_root or f"{tempfile.gettempdir()}/rlreplay-ray"
    servers: list[Any] = []
    for index, node in enumerate(nodes):
        options: dict[str, Any] = {
            "name": f"{registry_name(name)}:{index}",
            "namespace": namespace,
            "lifetime": "detached",
            "num_cpus": num_cpus,
            "memory": int(memory_mb * _MiB),
            "max_restarts": max_restarts,
            "max_task_retries": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(
                node["NodeID"], soft=False, _fail_on_unavailable=True
            ),
        }
        if resource:
            options["resources"] = {resource: resource_per_server}
        servers.append(
            ray.remote(ReplayServerActor)
            .options(**options)
            .remote(
                name,
                index,
                registry=registry,
                data_root=root,
                backup_url=f"{backup_url.rstrip('/')}/{name}-{index}" if backup_url else None,
                host=host,
                serve_flags=flags,
                ready_timeout_s=ready_timeout_s,
            )
        )
    ray.get(registry.set_servers.remote(servers))
    try:
        return list(ray.get([s.info.remote() for s in servers], timeout=ready_timeout_s + 30))
    except (ray.exceptions.RayError, TimeoutError) as exc:
        _kill(servers, registry)
        raise RuntimeError(f"replay deployment {name!r} did not start: {exc}") from exc


def _kill(servers: list[Any], registry: Any) -> None:
    for actor in [*servers, registry]:
        ray.kill(actor, no_restart=True)


def shutdown(
    name: str, *, namespace: str | None = None, snapshot: bool = True, timeout_s: float = 120.0
) -> list[dict[str, Any]]:
    """Stop deployment ``name``: each server takes a final snapshot (when ``snapshot`` and
    it has a backup URL) and stops with SIGTERM; then the actors and the registry end.

    Returns:
        Each server's answer to :meth:`~rlreplay.clients.ray_server.ReplayServerActor.stop`
        (or ``{"error": ...}`` for one that could not be asked).

    Raises:
        ValueError: No deployment of that name.
    """
    registry = find_registry(name, namespace)
    servers = ray.get(registry.servers.remote(), timeout=timeout_s)
    stops = [s.stop.remote(snapshot=snapshot, timeout_s=timeout_s / 2) for s in servers]
    deadline = time.monotonic() + timeout_s
    results: list[dict[str, Any]] = []
    for stop in stops:
        try:
            results.append(ray.get(stop, timeout=max(1.0, deadline - time.monotonic())))
        except (ray.exceptions.RayError, TimeoutError) as exc:
            results.append({"error": repr(exc)})
    _kill(servers, registry)
    return results
