"""The GPU sidecar: a table's selection state in device memory, batched selection there,
and collection of the chosen items' values into device tensors.

In a trainer: :class:`GpuSampler` (``from rlreplay import GpuSampler``) and the
:class:`ReplayDataset` over it; as a process: ``rlreplay sidecar`` (:mod:`rlreplay.gpu.service`).
It talks to the service only through the client and the HTTP contract. Torch lives here and
only here: the service never imports this package.

Without torch, importing this package raises :class:`TorchMissing`, an ``ImportError`` that
names the extra to install.
"""

from __future__ import annotations

# GpuSampler and ReplayDataset are public from the package's root (rlreplay.__all__).
__all__ = ["GpuBatch", "TorchMissing"]


class TorchMissing(ModuleNotFoundError):
    """torch, which the ``gpu`` extra installs, is not installed."""


try:
    import torch  # noqa: F401  # checked first: the modules below all need it
except ModuleNotFoundError as exc:
    if exc.name != "torch":
        raise
    raise TorchMissing(
        "rlreplay's GPU sidecar (GpuSampler, ReplayDataset, rlreplay sidecar) needs torch, "
        "which is not installed: pip install 'rlreplay[gpu]' "
        "(from a clone of the repository: pip install -e '.[gpu]')",
        name="torch",
    ) from exc

from rlreplay.gpu.sampler import GpuBatch  # noqa: E402
