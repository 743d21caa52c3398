"""The synchronous clients' lease: a claim's items, acknowledged or released from plain code."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from rlreplay.clients.loop_thread import LoopThread
from rlreplay.clients.rollouts import LeaseBase

__all__ = ["SyncLease"]


class SyncLease:
    """A lease (:class:`~rlreplay.clients.rollouts.Lease`) whose calls block::

        with client.claim("rollouts", task="trainer", batch_size=64) as lease:
            train_on(lease.items)

    The ``with`` block acknowledges the items when it ends normally and releases them when it
    raises.

    Args:
        loop: The client's loop thread.
        lease: The async lease.
    """

    def __init__(self, loop: LoopThread, lease: LeaseBase) -> None:
        self._loop = loop
        self.lease = lease

    @property
    def items(self) -> list[dict[str, Any]]:
        """``{"key", "value", "priority", "group", "version"}`` each."""
        return self.lease.items

    @property
    def keys(self) -> list[str]:
        """The keys handed out."""
        return self.lease.keys

    @property
    def id(self) -> str:
        """The lease's id ("" when the claim handed out nothing)."""
        return self.lease.id

    @property
    def expires_at(self) -> float:
        """Unix time when the server releases what is not acknowledged."""
        return self.lease.expires_at

    @property
    def done(self) -> bool:
        """Whether every item was acknowledged or released."""
        return self.lease.done

    def __len__(self) -> int:
        return len(self.lease)

    def ack(self, keys: Sequence[str] | None = None) -> int:
        """The items (all when ``keys`` is None) count as consumed by the task, durably.

        Raises:
            LeaseNotFound: The lease expired (its items were handed out again).
        """
        return self._loop.run(self.lease.ack(keys))

    def release(self, keys: Sequence[str] | None = None) -> int:
        """The items (all when ``keys`` is None) are ready for the task again."""
        return self._loop.run(self.lease.release(keys))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._loop.run(self.lease.__aexit__(exc_type, exc, traceback))
