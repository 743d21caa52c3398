"""The servers of a sharded client, and how a call is sent to them.

:class:`ShardFanOut` holds one :class:`~rlreplay.clients.client.ReplayClient` per server and
the rendezvous hashing that says which server owns a key. It splits keys by owner and sends
calls to several servers concurrently, answers by server; an error of a server that cannot
be reached names that server. Both the sharded client's item and table calls
(:mod:`rlreplay.clients.sharded`) and its rollout calls
(:mod:`rlreplay.clients.sharded_rollouts`) go through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import numpy.typing as npt

from rlreplay.wire.errors import Unavailable, ValidationFailed

if TYPE_CHECKING:
    from rlreplay.clients.client import ReplayClient
    from rlreplay.clients.rendezvous import Rendezvous

__all__ = ["ShardFanOut"]

T = TypeVar("T")


class ShardFanOut:
    """Several servers' clients, the owner of each key among them, and calls sent to them.

    A shard is the index of a server in ``urls`` (and in ``shards`` and the ring's names).

    Args:
        urls: The servers' normalized URLs, named in errors.
        shards: One client per server, in the order of ``urls``.
        ring: Which server owns a key, its shards in the order of ``urls``.

    Raises:
        ValueError: ``urls``, ``shards`` and the ring's names are not as many.
    """

    def __init__(
        self, urls: Sequence[str], shards: Sequence[ReplayClient], *, ring: Rendezvous
    ) -> None:
        if not len(urls) == len(shards) == len(ring.names):
            raise ValueError(
                f"{len(urls)} URLs, {len(shards)} shard clients and {len(ring.names)} "
                "shard names must be as many"
            )
        self.urls = list(urls)
        self.shards = list(shards)
        self._ring = ring

    def split(self, keys: Sequence[str]) -> dict[int, npt.NDArray[np.intp]]:
        """Shard -> the positions of the keys it owns (see ``Rendezvous.split``).

        Raises:
            ValidationFailed: A key is not a string (the server's 422, said before sending).
        """
        try:
            return self._ring.split(keys)
        except TypeError as exc:
            raise ValidationFailed(str(exc)) from None

    def named(self, shard: int, error: BaseException) -> BaseException:
        """``error``, or when the server could not be reached, an ``Unavailable`` naming it."""
        if not isinstance(error, Unavailable):
            return error
        named = Unavailable(
            f"shard {self.urls[shard]} is unavailable: {error.message}",
            retry_after=error.retry_after,
        )
        named.__cause__ = error
        return named

    async def on(self, shard: int, call: Awaitable[T]) -> T:
        """``call``'s answer; a server that cannot be reached is named in the error."""
        try:
            return await call
        except Unavailable as exc:
            raise self.named(shard, exc) from exc

    async def outcomes(self, calls: Mapping[int, Awaitable[T]]) -> dict[int, T | BaseException]:
        """Every call's answer or error by shard, sent concurrently (gathered, not wrapped: a
        caller cancelled early leaves none of them never awaited)."""
        outcomes = await asyncio.gather(*calls.values(), return_exceptions=True)
        return {
            s: self.named(s, o) if isinstance(o, BaseException) else o
            for s, o in zip(calls, outcomes, strict=True)
        }

    async def each(self, calls: Mapping[int, Awaitable[T]]) -> dict[int, T]:
        """Every call's answer by shard, sent concurrently; the first error in shard order
        is raised once all are done."""
        answers: dict[int, T] = {}
        for s, outcome in (await self.outcomes(calls)).items():
            if isinstance(outcome, BaseException):
                raise outcome
            answers[s] = outcome
        return answers

    async def every(self, call: Callable[[ReplayClient], Awaitable[T]]) -> list[T]:
        """``call(client)`` on every server, answers in shard order."""
        answers = await self.each({s: call(c) for s, c in enumerate(self.shards)})
        return [answers[s] for s in range(len(self.shards))]
