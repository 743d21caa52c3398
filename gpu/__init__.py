"""The GPU sidecar: a table's selection state in device memory, batched selection there,
and collection of the chosen items' values into device tensors.

In a trainer: :class:`GpuSampler` (``from rlreplay import GpuSampler``) and the
:class:`ReplayDataset` over it; as a process: ``rlreplay sidecar`` (:mod:`rlreplay.gpu.service`).
It talks to the service only through the client and the HTTP contract. Torch lives here and
only here: the service never imports this package.
"""

from __future__ import annotations

from rlreplay.gpu.dataset import ReplayDataset
from rlreplay.gpu.sampler import GpuBatch, GpuSampler

__all__ = ["GpuBatch", "GpuSampler", "ReplayDataset"]
