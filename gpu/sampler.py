"""``GpuSampler``: device-resident selection and collection for a trainer process.

It follows one table's change feed into device memory (:class:`ChangeFollower`), draws
batches there (:class:`Selector`) and fetches the picks' values into device tensors
(:class:`Collector`)::

    async with ReplayClient(url) as rb, GpuSampler(rb, "rollouts", device="cuda") as sampler:
        batch = await sampler.sample(256, strategy="prioritized", fields=["obs", "tokens"])
        batch.columns["obs"]            # (256, ...) on the device
        batch.columns["tokens"]         # packed end to end, with "tokens.cu_seqlens"
        batch.weights                   # importance weights, on the device

:meth:`GpuSampler.batches` keeps the next batch's selection and fetch in flight while the
caller works on the current one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import numpy as np
import torch

from rlreplay.clients.client import ReplayClient
from rlreplay.gpu.collection import BatchTooLarge, Collector, MissingItems
from rlreplay.gpu.device_index import DeviceIndex
from rlreplay.gpu.follower import ChangeFollower
from rlreplay.gpu.selection import Selector, Strategy
from rlreplay.wire.errors import DeadlineExceeded

__all__ = ["GpuBatch", "GpuSampler", "SamplerTimes"]

_DRAW_ATTEMPTS = 5
#: Bytes a pick's probability and weight take in a batch (float64 each).
_PICK_BYTES = 16


@dataclass(slots=True)
class GpuBatch:
    """One batch: the picks' keys, and device tensors.

    Attributes:
        keys: The picks' keys, in batch order (a key picked twice appears twice).
        probabilities: Each pick's probability in one draw (float64).
        weights: Importance-sampling weights (float64; 1 but for ``prioritized``).
        columns: The requested fields, stacked along a new first axis; a variable-length
            1-D field packed end to end with its int32 ``"<field>.cu_seqlens"``.
    """

    keys: list[str]
    probabilities: torch.Tensor
    weights: torch.Tensor
    columns: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(slots=True)
class SamplerTimes:
    """Where the sampler's time went (seconds, totals), for ``/metrics`` and benchmarks."""

    batches: int = 0
    select_s: float = 0.0
    collect_s: float = 0.0


class GpuSampler:
    """Selection state of one table on a torch device, and batches drawn from it.

    Args:
        client: The replay service's client (the caller owns it).
        table: The table to follow.
        device: The torch device (``"cuda"``, ``"cuda:1"``, ``"cpu"``).
        seed: Seed of the draws (fresh when None); a draw given its own seed ignores it.
        exponent: alpha of ``prioritized``; the table's own when None and its sampler is
            prioritized, else 0.6.
        is_exponent: beta of ``prioritized``; likewise, else 0.4.
        half_life_s: The half-life of ``ptime``; the table's own when None and its sampler
            is ptime, else 60.
        follow: Keep following the table in a background task (``start``/``stop``); with
            False the index is brought up to date only by :meth:`refresh`.
        wait_ms: How long one long poll of the change feed waits.
        max_batch_bytes: The most bytes of keys, probabilities, weights and field values
            one batch may hold (None: no limit); a draw past it raises
            :class:`~rlreplay.gpu.collection.BatchTooLarge` before its columns are built.
    """

    def __init__(
        self,
        client: ReplayClient,
        table: str,
        *,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        exponent: float | None = None,
        is_exponent: float | None = None,
        half_life_s: float | None = None,
        follow: bool = True,
        wait_ms: int = 1000,
        max_batch_bytes: int | None = None,
    ) -> None:
        if max_batch_bytes is not None and max_batch_bytes <= 0:
            raise ValueError(f"max_batch_bytes ({max_batch_bytes}) must be > 0")
        self.client = client
        self.max_batch_bytes = max_batch_bytes
        self.table = table
        self.device = torch.device(device)
        self.index = DeviceIndex(self.device)
        self.follower = ChangeFollower(client, table, self.index, wait_ms=wait_ms)
        self.collector = Collector(client, table, self.device)
        self._params: dict[str, float | None] = {
            "exponent": exponent,
            "is_exponent": is_exponent,
            "half_life_s": half_life_s,
        }
        self.selector: Selector | None = None
        self._follow = follow
        self._generator = torch.Generator(device=self.device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self.times = SamplerTimes()

    # -- lifetime ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the table's config, load its state, and start following it."""
        if self.selector is None:
            config = (await self.client.describe_table(self.table))["config"]
            sampler = config.get("sampler") or {}
            own = {k: v for k, v in sampler.items() if k != "type"}
            params = {k: v if v is not None else own.get(k) for k, v in self._params.items()}
            self.selector = Selector(
                self.index, **{k: float(v) for k, v in params.items() if v is not None}
            )
        await self.follower.resync()
        if self._follow:
            self.follower.start()

    async def stop(self) -> None:
        """Stop following (idempotent)."""
        await self.follower.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def refresh(self) -> None:
        """Apply every change the server has now."""
        await self.follower.catch_up()

    # -- drawing -----------------------------------------------------------------------------

    def _selector(self) -> Selector:
        if self.selector is None:
            raise RuntimeError("GpuSampler is not started: use 'async with' or await start()")
        return self.selector

    async def sample(
        self,
        batch_size: int,
        *,
        strategy: Strategy = "uniform",
        fields: Sequence[str] = (),
        seed: int | None = None,
        timeout_s: float = 10.0,
    ) -> GpuBatch:
        """Select ``batch_size`` picks on the device and collect their ``fields``.

        Waits up to ``timeout_s`` for the table to hold an item. A pick whose item was
        deleted on the server before its value was fetched is drawn again, after catching
        up with the server.

        Raises:
            DeadlineExceeded: The table stayed empty for ``timeout_s``.
            ValueError: ``batch_size`` below 1 or an unknown strategy.
            ValidationFailed: A field is in no value, or the values do not stack.
            BatchTooLarge: The batch would hold more than ``max_batch_bytes``.
        """
        selector = self._selector()
        generator = self._generator
        if seed is not None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed)
        await self._wait_nonempty(timeout_s)
        for attempt in range(_DRAW_ATTEMPTS):
            started = time.perf_counter()
            picks = selector.select(batch_size, strategy, generator)
            slots = picks.slots.cpu().numpy()  # the one host copy: to name the keys
            picked = time.perf_counter()
            distinct, inverse = np.unique(slots, return_inverse=True)
            keys = self.index.keys
            where: np.ndarray[Any, np.dtype[np.int64]] | None = None
            if len(distinct) == len(slots):  # no pick repeats: fetch in pick order
                names = fetch_keys = [keys[s] or "" for s in slots.tolist()]
            else:  # fetch each item once; the copy to the host buffer repeats rows
                fetch_keys = [keys[s] or "" for s in distinct.tolist()]
                names = [fetch_keys[i] for i in inverse.tolist()]
                where = inverse.astype(np.int64)
            limit, reserved = self.max_batch_bytes, 0
            if limit is not None:  # the keys, probabilities and weights, before any value
                reserved = sum(map(len, names)) + _PICK_BYTES * len(names)
                if reserved > limit:
                    raise BatchTooLarge(reserved, len(names), limit)
            try:
                columns = await self.collector.collect(
                    fetch_keys, where, fields, limit=limit, reserved=reserved
                )
            except MissingItems:
                if attempt + 1 == _DRAW_ATTEMPTS:
                    raise
                await self.follower.catch_up()
                await self._wait_nonempty(timeout_s)
                continue
            self.times.batches += 1
            self.times.select_s += picked - started
            self.times.collect_s += time.perf_counter() - picked
            return GpuBatch(names, picks.probabilities, picks.weights, columns)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _wait_nonempty(self, timeout_s: float) -> None:
        if len(self.index):
            return
        deadline = time.monotonic() + timeout_s
        while not len(self.index):
            if time.monotonic() >= deadline:
                raise DeadlineExceeded(f"table {self.table!r} held no item for {timeout_s} s")
            if self._follow and self.follower.caught_up:
                await asyncio.sleep(0.01)  # the background poll applies what comes
            else:
                await self.follower.catch_up()
                if not len(self.index):
                    await asyncio.sleep(0.01)

    async def batches(
        self,
        batch_size: int,
        *,
        strategy: Strategy = "uniform",
        fields: Sequence[str] = (),
        prefetch: int = 1,
    ) -> AsyncGenerator[GpuBatch, None]:
        """Batches without end, ``prefetch`` of them drawn and fetched ahead of the caller.

        The next batches are tasks owned by the generator: closing it cancels them.
        """
        if prefetch < 1:
            raise ValueError(f"prefetch ({prefetch}) must be >= 1")

        def ahead() -> asyncio.Task[GpuBatch]:
            return asyncio.ensure_future(self.sample(batch_size, strategy=strategy, fields=fields))

        pending = [ahead() for _ in range(prefetch)]
        try:
            while True:
                batch = await pending.pop(0)
                pending.append(ahead())
                yield batch
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def describe(self) -> dict[str, Any]:
        """The follower's and the draws' figures (for ``/metrics``)."""
        f = self.follower
        return {
            "items": len(self.index),
            "seq": f.seq,
            "server_seq": f.server_seq,
            "lag_events": f.lag_events,
            "lag_s": f.lag_s,
            "resyncs": f.resyncs,
            "events_applied": f.events_applied,
            "batches": self.times.batches,
            "select_s": self.times.select_s,
            "collect_s": self.times.collect_s,
            "bytes_collected": self.collector.bytes_collected,
        }
