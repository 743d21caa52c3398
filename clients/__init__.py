"""The rlreplay clients: an async HTTP client, a synchronous one, and their sharded forms.

Import them from the package's root (``from rlreplay import ReplayClient``): its
``__all__`` is the one list of what is public. The modules here are internal; for code
written against ``rlreplay.clients``, the root's public names load from here too.
Errors are the tree drawn in :mod:`rlreplay.wire.errors`, which the server raises too, and
:class:`~rlreplay.clients.event_loop.WrongEventLoop` (a ``ReplayError``), the client's own.
Importable with only httpx, msgpack, msgspec and numpy installed; torch is used only when a
tensor is handed over (and ``BFloat16Array.to_torch`` is called).
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """``rlreplay``'s public ``name``, for ``from rlreplay.clients import ReplayClient``."""
    import rlreplay

    if name not in rlreplay.__all__ or name in {"GpuSampler", "ReplayDataset", "__version__"}:
        raise AttributeError(f"module 'rlreplay.clients' has no attribute {name!r}")
    return getattr(rlreplay, name)
