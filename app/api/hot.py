"""The hot data routes, served straight from the ASGI scope.

Every ``POST /v1/tables/{table}/<op>`` of the data plane (push, batchGet, batchDelete,
priorities, sample, and the rollout tables' patch and claim) is answered here without
passing through Starlette's middleware stack, router and FastAPI's parameter resolution,
a large share of a small request's time (``python -m bench fast_paths`` measures it: its
``--no-hot-routes`` arm; docs/benchmarks.md, "Fast paths", has the figures).

Nothing else differs. The work is the routes' own :data:`~rlreplay.app.api.deps.BodyHandler`
(``push_reply``, ``sample_reply``...), and
:class:`~rlreplay.app.api.middleware.RequestContextMiddleware`
wraps it as it wraps the framework (request ids, API keys, the body limit, metrics, access
logs, the 500 answer). A :class:`~rlreplay.wire.errors.ReplayError` gets the same body as the
framework's handler gives it. The routes stay registered with FastAPI, which documents them
and serves what this path passes on: other methods and paths, and table names the
contract refuses (FastAPI's 422). ``tests/api/test_hot.py`` sends the same requests both
ways and compares the answers.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, cast

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope, Send

from rlreplay.app.api import items, rollouts, sampling
from rlreplay.app.api.deps import BodyHandler
from rlreplay.app.api.encoding import format_of
from rlreplay.app.api.errors import wants_msgpack_header
from rlreplay.app.api.gathered_writes import GATHERED_WRITES, AnswerPieces
from rlreplay.app.api.middleware import RequestContextMiddleware, send_error
from rlreplay.app.engine.engine import TABLE_NAME
from rlreplay.wire.errors import ReplayError

if TYPE_CHECKING:
    from rlreplay.app.engine.engine import Engine
    from rlreplay.app.metrics import Metrics

__all__ = ["HOT_HANDLERS", "HotRoutes", "ReplayApp"]

#: The hot operations: the last path segment, and the handler doing the route's work.
HOT_HANDLERS: dict[str, BodyHandler] = {
    "items": items.push_reply,
    "items:batchGet": items.batch_get_reply,
    "items:batchDelete": items.batch_delete_reply,
    "priorities": items.priorities_reply,
    "sample": sampling.sample_reply,
    "items:patch": rollouts.patch_reply,
    "claim": rollouts.claim_reply,
}

_PATH = re.compile(
    r"/v1/tables/("
    + TABLE_NAME.pattern.strip("^$")
    + r")/("
    + "|".join(re.escape(op) for op in HOT_HANDLERS)
    + r")"
)


class HotRoutes:
    """The ASGI app of the hot operations (behind a :class:`RequestContextMiddleware`)."""

    def __init__(self, engine: Engine, metrics: Metrics) -> None:
        """Finds the FastAPI route of each hot operation (for metrics and logs).

        Args:
            engine: The engine they serve.
            metrics: Where their items are counted.

        Raises:
            LookupError: A hot operation has no ``POST`` route in the routers.
        """
        self.engine = engine
        self.metrics = metrics
        self._routes: dict[str, APIRoute] = {}  # by operation
        # by id(route): APIRoute is unhashable, and the routes live as long as their modules
        self._handlers: dict[int, BodyHandler] = {}
        for op, handler in HOT_HANDLERS.items():
            path = f"/v1/tables/{{table}}/{op}"
            found = [
                r
                for r in (*items.router.routes, *sampling.router.routes, *rollouts.router.routes)
                if isinstance(r, APIRoute) and r.path == path and "POST" in (r.methods or ())
            ]
            if not found:
                raise LookupError(f"no POST route {path}")
            self._routes[op] = found[0]
            self._handlers[id(found[0])] = handler

    def match(self, scope: Scope) -> bool:
        """Whether this is a hot request; if so, leaves its route and table on the scope."""
        m = _PATH.fullmatch(scope["path"])
        if m is None:
            return False
        table, op = m.groups()
        scope["route"] = self._routes[op]
        scope["path_params"] = {"table": table}
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Runs the operation :meth:`match` found; a :class:`ReplayError` is its answer."""
        handler = self._handlers[id(scope["route"])]
        content_type = accept = b""
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value
            elif name == b"accept":
                accept = value
        try:
            fmt = format_of(content_type.decode("latin-1"))
            body = await _read_body(receive)
            if type(body) is not bytes and handler is not items.push_reply:
                body = bytes(body)  # a long body read into a buffer: a push reads it there
            reply = await handler(
                self.engine,
                self.metrics,
                scope["path_params"]["table"],
                cast(bytes, body),
                fmt,
                wants_msgpack_header(accept.decode("latin-1")),
            )
        except ReplayError as exc:
            await send_error(scope, receive, send, exc)
            return
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": [
                    (b"content-length", str(len(reply.body)).encode()),
                    (b"content-type", reply.media_type.encode()),
                ],
            }
        )
        answer = reply.body
        if type(answer) is AnswerPieces and not scope.get(GATHERED_WRITES):
            answer = answer.join()  # a connection that writes one buffer at a time
        await send({"type": "http.response.body", "body": answer})


async def _read_body(receive: Receive) -> bytes | memoryview:
    """The whole request body, as Starlette's ``Request.body`` reads it (a long one in the
    buffer it was read into: :mod:`rlreplay.app.api.direct_bodies`)."""
    chunks: list[bytes | memoryview] = []
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class ReplayApp(FastAPI):
    """FastAPI, with the hot data routes answered by :class:`HotRoutes` once it is set."""

    _hot: tuple[HotRoutes, RequestContextMiddleware] | None = None

    def serve_hot_routes(self, routes: HotRoutes, context: RequestContextMiddleware) -> None:
        """Sends the requests ``routes`` matches through ``context`` (whose app it is)."""
        self._hot = (routes, context)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serves a hot request directly, anything else through FastAPI."""
        hot = self._hot
        if (
            hot is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and hot[0].match(scope)
        ):
            scope["app"] = self
            await hot[1](scope, receive, send)
            return
        await super().__call__(scope, receive, send)
