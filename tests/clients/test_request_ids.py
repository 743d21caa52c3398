"""The client puts a request id on every write, and its retries send the same one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest

from rlreplay.clients import ReplayClient

WRITES: dict[str, Callable[[ReplayClient], Awaitable[Any]]] = {
    "push": lambda rb: rb.push("t", [{"key": "a", "value": 1}]),
    "push_columns": lambda rb: rb.push_columns("t", ["a"], {"x": np.zeros((1, 2))}),
    "delete": lambda rb: rb.delete("t", ["a"]),
    "patch": lambda rb: rb.patch("t", {"a": {"reward": 1.0}}),
}


@pytest.mark.parametrize("write", sorted(WRITES))
async def test_a_retried_write_sends_the_same_request_id(write: str) -> None:
    bodies: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(msgpack.unpackb(request.content))
        if len(bodies) == 1:  # the server may have acted: only an id makes a retry safe
            error = {"error": {"code": "unavailable", "message": "restarting"}}
            return httpx.Response(
                503, content=msgpack.packb(error), headers={"Content-Type": "application/msgpack"}
            )
        ok = {"accepted": 1, "missing": 0}
        return httpx.Response(
            202, content=msgpack.packb(ok), headers={"Content-Type": "application/msgpack"}
        )

    transport = httpx.MockTransport(answer)
    async with ReplayClient("http://replay", transport=transport, backoff_s=0.001) as rb:
        await WRITES[write](rb)
        await WRITES[write](rb)
    ids = [body["request_id"] for body in bodies]
    assert len(ids) == 3 and ids[0] == ids[1] != ids[2]
