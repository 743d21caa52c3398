"""``ReplayDataset``: a ``torch.utils.data.IterableDataset`` of device batches.

A training loop is synchronous; the sampler is async. Each iterator runs a
:class:`GpuSampler` on an event loop in a thread it owns, and keeps ``prefetch`` batches
selected and fetched ahead, so the next batch's fetch overlaps the loop's work on the
current one::

    dataset = ReplayDataset("http://127.0.0.1:8000", "rollouts", batch_size=256,
                            strategy="prioritized", fields=["obs"], device="cuda")
    with dataset.iterate() as batches:
        for step, batch in zip(range(10_000), batches):
            loss = model(batch.columns["obs"]) * batch.weights

Batches already live on the device: use it directly, or with ``DataLoader(dataset,
batch_size=None)`` and no worker processes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Iterator, Sequence
from types import TracebackType
from typing import Any, Self

import torch
from torch.utils.data import IterableDataset

from rlreplay.clients.client import ReplayClient
from rlreplay.gpu.sampler import GpuBatch, GpuSampler
from rlreplay.gpu.selection import Strategy

__all__ = ["BatchIterator", "ReplayDataset"]


class ReplayDataset(IterableDataset[GpuBatch]):
    """Endless batches of one table, drawn on ``device``.

    Args:
        server: The replay service's URL.
        table: The table.
        batch_size: Picks per batch.
        strategy: How to select (see :mod:`rlreplay.gpu.selection`).
        fields: Fields of the values to collect.
        device: The torch device.
        api_key: The service's key, if it needs one.
        prefetch: Batches drawn and fetched ahead of the loop.
        sampler_options: Passed to :class:`GpuSampler` (``seed``, ``exponent``...).
    """

    def __init__(
        self,
        server: str,
        table: str,
        *,
        batch_size: int,
        strategy: Strategy = "uniform",
        fields: Sequence[str] = (),
        device: torch.device | str = "cpu",
        api_key: str | None = None,
        prefetch: int = 2,
        **sampler_options: Any,
    ) -> None:
        super().__init__()
        self.server = server
        self.table = table
        self.batch_size = batch_size
        self.strategy: Strategy = strategy
        self.fields = list(fields)
        self.device = device
        self.api_key = api_key
        self.prefetch = prefetch
        self.sampler_options = sampler_options

    def __iter__(self) -> Iterator[GpuBatch]:
        return self.iterate()

    def iterate(self) -> BatchIterator:
        """A new iterator; close it (or use it as a context manager) to stop its thread."""
        return BatchIterator(self)


class BatchIterator:
    """Batches from a sampler running on an event loop in a thread this object owns."""

    def __init__(self, dataset: ReplayDataset) -> None:
        self._dataset = dataset
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rlreplay-dataset", daemon=True
        )
        self._thread.start()
        self._closed = False
        try:
            self._batches: AsyncGenerator[GpuBatch, None] = self._call(self._open())
        except BaseException:
            self.close()
            raise

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _open(self) -> AsyncGenerator[GpuBatch, None]:
        d = self._dataset
        self._client = ReplayClient(d.server, d.api_key)
        self._sampler = GpuSampler(self._client, d.table, device=d.device, **d.sampler_options)
        await self._sampler.start()
        return self._sampler.batches(
            d.batch_size, strategy=d.strategy, fields=d.fields, prefetch=d.prefetch
        )

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> GpuBatch:
        if self._closed:
            raise StopIteration
        batch: GpuBatch = self._call(anext(self._batches))
        return batch

    def close(self) -> None:
        """Cancel the batches in flight, stop the sampler and the thread (idempotent)."""
        if self._closed:
            return
        self._closed = True

        async def shut() -> None:
            batches = getattr(self, "_batches", None)
            if batches is not None:
                await batches.aclose()
            sampler = getattr(self, "_sampler", None)
            if sampler is not None:
                await sampler.stop()
            client = getattr(self, "_client", None)
            if client is not None:
                await client.aclose()

        try:
            self._call(shut())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop.close()

    def __del__(self) -> None:
        # an iterator dropped unclosed (a DataLoader's, at the end of a loop) stops its thread
        if not getattr(self, "_closed", True):
            self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
