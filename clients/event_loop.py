"""Which event loop an async client belongs to.

An async client's connections, its semaphore and the tasks of its streams and writers belong
to the event loop it first ran on: used from another loop they would fail half-way (after a
request was sent, with ``RuntimeError: Event loop is closed`` when the first loop is gone, as
with one ``asyncio.run(rb.push(...))`` per step). :func:`bound_loop` finds that out before
anything is sent, and says what to do instead.
"""

from __future__ import annotations

import asyncio

from rlreplay.wire.errors import ReplayError

__all__ = ["WrongEventLoop", "bound_loop"]


class WrongEventLoop(ReplayError):
    """An async client was called from an event loop other than the one it first ran on.

    Raised before anything is sent: the call changed nothing on the server.
    """


def bound_loop(owner: asyncio.AbstractEventLoop | None, what: str) -> asyncio.AbstractEventLoop:
    """The running loop, which must be ``owner`` unless the client has not run yet (None).

    Args:
        owner: The loop the client first ran on, or None.
        what: The client's class name, for the message.

    Raises:
        WrongEventLoop: A loop other than ``owner`` is running.
    """
    loop = asyncio.get_running_loop()
    if owner is None or owner is loop:
        return loop
    state = "now closed" if owner.is_closed() else "still open"
    raise WrongEventLoop(
        f"this {what} first ran on another event loop ({state}), which its connections "
        "belong to, and was called from a new one (one asyncio.run() per call does this). "
        f"Create the client inside the loop that uses it (async with {what}(...) inside "
        "the coroutine that asyncio.run() runs), or use rlreplay.Client for synchronous "
        "code; nothing was sent"
    )
