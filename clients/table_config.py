"""The contract's ``TableConfig`` as ``create_table``'s keyword arguments build it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["table_config"]


def table_config(
    *,
    sampler: Mapping[str, Any] | None,
    remover: Mapping[str, Any] | None,
    max_size: int | None,
    max_times_sampled: int,
    rate_limiter: Mapping[str, Any] | None,
    max_staleness: int | None,
    delete_after_ack: Sequence[str],
    admission: Mapping[str, Any] | None,
    ttl_s: float | None,
    episodes: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The ``PUT /v1/tables/{name}`` body: settings left at None stay out of it, so the
    server's defaults apply (and a table created by an older client compares equal)."""
    config: dict[str, Any] = {
        "max_size": max_size,
        "max_times_sampled": max_times_sampled,
        "rate_limiter": dict(rate_limiter) if rate_limiter is not None else None,
    }
    optional = {
        "sampler": dict(sampler) if sampler is not None else None,
        "remover": dict(remover) if remover is not None else None,
        "max_staleness": max_staleness,
        "delete_after_ack": list(delete_after_ack) or None,
        "admission": dict(admission) if admission is not None else None,
        "ttl_s": ttl_s,
        "episodes": dict(episodes) if episodes is not None else None,
    }
    config.update({name: value for name, value in optional.items() if value is not None})
    return config
