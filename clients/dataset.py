"""A ``torch.utils.data.IterableDataset`` over a task's claims, for a trainer's loop.

Torch is imported when the dataset is made, never by importing this module, so the client
stays importable without torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from rlreplay.clients.sync_client import Client

__all__ = ["RolloutBatches", "rollout_dataset"]


class RolloutBatches:
    """Micro-batches of one task's claims, as a plain (synchronous) iterator.

    Each ``iter()`` opens its own :class:`~rlreplay.clients.sync_client.Client` (an event
    loop on a thread of its own), so it works in a ``DataLoader`` worker process as well as
    in the trainer's own, a notebook's and inside a running event loop. A batch is acknowledged
    when the next one is asked for (:func:`~rlreplay.clients.rollouts.consume_leases`),
    and what is in hand is released when iteration stops.
    """

    def __init__(
        self,
        base_url: str,
        table: str,
        *,
        task: str,
        batch_size: int,
        fields: Sequence[str] | None = None,
        group_size: int | None = None,
        prefetch: int = 1,
        lease_s: float = 60.0,
        api_key: str | None = None,
        max_batches: int | None = None,
    ) -> None:
        self.base_url = base_url
        self.table = table
        self.task = task
        self.batch_size = batch_size
        self.fields = list(fields) if fields is not None else None
        self.group_size = group_size
        self.prefetch = prefetch
        self.lease_s = lease_s
        self.api_key = api_key
        self.max_batches = max_batches

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        with (
            Client(self.base_url, self.api_key) as client,
            client.consume(
                self.table,
                task=self.task,
                batch_size=self.batch_size,
                fields=self.fields,
                group_size=self.group_size,
                prefetch=self.prefetch,
                lease_s=self.lease_s,
            ) as leases,
        ):
            n = 0
            while self.max_batches is None or n < self.max_batches:
                lease = next(leases)
                n += 1
                yield lease.items
                if n == self.max_batches:  # the last one is used: acknowledged
                    lease.ack()


def rollout_dataset(base_url: str, table: str, **kwargs: Any) -> Any:
    """A ``torch.utils.data.IterableDataset`` yielding :class:`RolloutBatches`' micro-batches
    (use it with ``DataLoader(dataset, batch_size=None)``: each element is a batch)."""
    from torch.utils.data import IterableDataset

    class RolloutDataset(IterableDataset):  # type: ignore[type-arg]
        """One task's claimed micro-batches of a rollout table."""

        def __init__(self) -> None:
            super().__init__()
            self.batches = RolloutBatches(base_url, table, **kwargs)

        def __iter__(self) -> Iterator[list[dict[str, Any]]]:
            return iter(self.batches)

    return RolloutDataset()
