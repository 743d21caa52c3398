"""Long request bodies read by the kernel straight into one buffer, handed to the app as is.

uvicorn's httptools protocol receives a body as ``bytes`` chunks: the event loop reads each
into its own buffer and copies it out, httptools copies the body's part of it once more for
``on_body``, the chunks are joined, and uvicorn's ``receive()`` makes ``bytes`` of the
result. A push of columns is many MiB, each copy into memory freshly mapped and faulted in.

For a body framed by a ``Content-Length`` of :data:`DIRECT_BODY_BYTES` or more (and within
the request limit), :class:`~rlreplay.app.api.connections.GuardedHttpToolsProtocol` instead
takes a buffer of that length from a :class:`~rlreplay.wire.buffer_pool.BufferPool` and
hands the transport a :class:`BodyReader` (``transport.set_protocol``), an
``asyncio.BufferedProtocol`` whose ``get_buffer`` is the part of the body still to come: the
kernel copies the bytes into it, and nothing else does. The few bytes of the body that came
with the head are copied in from the parser's ``on_body``. Once the body is whole the
connection's own protocol takes the transport back, with a fresh parser (the old one still
waits for the body it never saw), and the app's ``receive()`` (:func:`view_receive`) gives
the body as the ``memoryview`` it was read into.

The pool hands a buffer out again only once nothing holds a view of it: a request's values
are copied out of its body, so by the next request of that size the buffer is free, and its
pages are already mapped.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from starlette.types import Message

from rlreplay.wire.buffer_pool import BufferPool

__all__ = ["DIRECT_BODY_BYTES", "POOLED_BODY_BYTES", "BodyReader", "direct_reader", "view_receive"]

#: Bodies at least this long are read straight into a buffer of their length.
DIRECT_BODY_BYTES: Final = 256 << 10
#: Bodies up to this long get a pooled buffer (longer ones a fresh one, freed after use).
POOLED_BODY_BYTES: Final = 32 << 20
#: Pooled buffers a server keeps per event loop, 128 MiB at most, outside the cache's
#: limit: one per push in flight, up to four (a writer's pushes pipelined to share the
#: log's fdatasyncs), each then reused with its pages mapped rather than zeroed afresh.
POOLED_BODIES: Final = 4


class _Owner(Protocol):
    """What a :class:`BodyReader` needs of the connection's protocol."""

    def direct_body_read(self, nbytes: int) -> None: ...
    def direct_body_done(self) -> None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...
    def eof_received(self) -> bool | None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


class BodyReader(asyncio.BufferedProtocol):
    """The transport's protocol while one body is read into ``body`` (a writable view of
    its exact length), from ``filled`` bytes on; everything but the reads goes to
    ``owner``, which gets the transport back once the body is whole."""

    def __init__(self, owner: _Owner, body: memoryview, filled: int) -> None:
        self._owner = owner
        self.body = body
        self.filled = filled

    @property
    def complete(self) -> bool:
        """Whether the whole body is in."""
        return self.filled >= len(self.body)

    def take(self, data: bytes) -> None:
        """Copies ``data``, the next bytes of the body, in (the parser's ``on_body``)."""
        end = self.filled + len(data)
        self.body[self.filled : end] = data
        self.filled = end

    def get_buffer(self, sizehint: int) -> memoryview:
        # exactly the rest of the body: a pipelined request behind it stays in the socket
        return self.body[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        self._owner.direct_body_read(nbytes)
        if self.complete:
            self._owner.direct_body_done()

    def eof_received(self) -> bool | None:
        return self._owner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._owner.pause_writing()

    def resume_writing(self) -> None:
        self._owner.resume_writing()


class _Buffers(threading.local):
    """The buffers of long bodies, one pool per thread: each event loop (one per server,
    tests run several) takes and fills its own."""

    def __init__(self) -> None:
        self.pool = BufferPool(max_buffers=POOLED_BODIES)


_BUFFERS: Final = _Buffers()


def direct_reader(owner: _Owner, cycle: Any, limit: int) -> BodyReader | None:
    """A reader for a request body to read straight into a buffer: one framed by a single
    ``Content-Length`` from :data:`DIRECT_BODY_BYTES` up to ``limit``; else None. The
    request's cycle then receives its body with :func:`view_receive`.

    Args:
        owner: The connection's protocol.
        cycle: The request's uvicorn ``RequestResponseCycle`` (its task not started yet),
            whose scope holds the headers, their names in lower case.
        limit: The longest body read so (the request limit: a longer one is refused).
    """
    length = -1
    for name, value in cycle.scope["headers"]:
        if name == b"content-length":
            length = int(value) if value.isdigit() and length == -1 else -2
        elif name == b"transfer-encoding":
            return None
    if not DIRECT_BODY_BYTES <= length <= limit:
        return None
    if length <= POOLED_BODY_BYTES:
        body = _BUFFERS.pool.take(length)
    else:
        body = memoryview(bytearray(length))
    cycle.receive = view_receive(cycle)  # run_asgi looks it up once its task starts
    return BodyReader(owner, body, 0)


def view_receive(cycle: Any) -> Callable[[], Awaitable[Message]]:
    """uvicorn's ``RequestResponseCycle.receive`` for a cycle whose body is a view read by a
    :class:`BodyReader`: the same messages, the body handed over as it is (uvicorn's makes
    ``bytes`` of it, a copy).

    The cycle holds the function and the function only a weak reference to the cycle: a
    strong one would make each request a reference cycle that only the garbage collector
    frees, and a collection of a few thousand requests' cycles holds the event loop for
    tens of milliseconds. The cycle's task holds it while the app may call ``receive``.
    """
    cycle_ref = weakref.ref(cycle)

    async def receive() -> Message:
        cycle = cycle_ref()
        if cycle is None:  # the request is over and its cycle gone
            return {"type": "http.disconnect"}
        if cycle.waiting_for_100_continue and not cycle.transport.is_closing():
            cycle.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        if not cycle.disconnected and not cycle.response_complete:
            cycle.flow.resume_reading()
            await cycle.message_event.wait()
            cycle.message_event.clear()
        if cycle.disconnected or cycle.response_complete:
            return {"type": "http.disconnect"}
        body, cycle.body = cycle.body, b""
        return {"type": "http.request", "body": body, "more_body": cycle.more_body}

    return receive
