"""A tiny in-memory fake of the HTTP contract, served through ``httpx.MockTransport``."""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import httpx

from rlreplay.wire.codec import packb, to_jsonable, unpackb

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


def answer(request: httpx.Request, status: int, body: Any = None, **headers: str) -> httpx.Response:
    """Encode ``body`` as the request's ``Accept`` asks (msgpack or JSON)."""
    if body is None:
        return httpx.Response(status, headers=headers)
    if "msgpack" in request.headers.get("Accept", ""):
        content, kind = packb(body), "application/msgpack"
    else:
        content, kind = json.dumps(to_jsonable(body)).encode(), "application/json"
    return httpx.Response(status, content=content, headers={"Content-Type": kind, **headers})


def error(request: httpx.Request, status: int, code: str, **headers: str) -> httpx.Response:
    return answer(request, status, {"error": {"code": code, "message": f"{code}!"}}, **headers)


class FakeServer:
    """Follows the contract for tables and items; values kept as the msgpack bytes sent."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, Any]] = {}
        self.items: dict[str, dict[str, dict[str, Any]]] = {}
        self.requests: list[httpx.Request] = []
        self.clock = 0.0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/healthz":
            return answer(request, 200, {"status": "ok"})
        body = unpackb(request.content) if request.content else None
        if request.content:
            assert request.headers["Content-Type"] == "application/msgpack"
        parts = [unquote(part) for part in request.url.raw_path.decode().split("/")[3:]]
        if not parts:
            return answer(
                request, 200, {"tables": [{"name": n, **c} for n, c in self.tables.items()]}
            )
        name, rest = parts[0], parts[1:]
        method = request.method
        if not rest:
            if method == "PUT":
                if name in self.tables:
                    if self.tables[name] != body:
                        return error(request, 409, "table_exists")
                    return answer(request, 200, self._describe(name))
                self.tables[name], self.items[name] = body, {}
                return answer(request, 201, self._describe(name))
            if name not in self.tables:
                return error(request, 404, "table_not_found")
            if method == "GET":
                return answer(request, 200, self._describe(name))
            if method == "DELETE":
                del self.tables[name], self.items[name]
                return answer(request, 204)
        if name not in self.tables:
            return error(request, 404, "table_not_found")
        items = self.items[name]
        action = rest[0]
        if action == "items" and len(rest) == 1 and method == "POST":
            for item in body["items"]:
                self.clock += 1
                items[item["key"]] = {
                    "key": item["key"],
                    "value": packb(item["value"]),
                    "priority": item.get("priority", 1.0),
                    "inserted_at": self.clock,
                    "times_sampled": 0,
                }
            if body["wait"]:
                return answer(request, 200, {"committed": len(body["items"])})
            return answer(request, 202, {"accepted": len(body["items"])})
        if action == "items" and len(rest) == 2 and method == "GET":
            item = items.get(rest[1])
            if item is None:
                return error(request, 404, "item_not_found")
            return answer(request, 200, self._render(item))
        if action == "items:batchGet":
            found = [items.get(key) for key in body["keys"]]
            return answer(request, 200, {"items": [i and self._render(i) for i in found]})
        if action == "items:batchDelete":
            for key in body["keys"]:
                items.pop(key, None)
            return answer(request, 202, {"accepted": len(body["keys"])})
        if action == "sample":
            if body["batch_size"] < 1:
                return error(request, 422, "validation_error")
            if not items:
                return error(request, 504, "deadline_exceeded")
            chosen = random.choices(list(items.values()), k=body["batch_size"])
            batch = []
            for item in chosen:
                item["times_sampled"] += 1
                rendered = self._render(item)
                if not body.get("include_values", True):
                    del rendered["value"]
                batch.append({**rendered, "probability": 1 / len(items), "weight": 1.0})
            return answer(request, 200, {"items": batch})
        if action == "priorities":
            updated = [k for k in body["priorities"] if k in items]
            for key in updated:
                items[key]["priority"] = body["priorities"][key]
            missing = len(body["priorities"]) - len(updated)
            return answer(request, 200, {"updated": len(updated), "missing": missing})
        return error(request, 404, "not_found")

    def _describe(self, name: str) -> dict[str, Any]:
        stats = {"size": len(self.items[name])}
        return {"name": name, "config": self.tables[name], "stats": stats}

    @staticmethod
    def _render(item: dict[str, Any]) -> dict[str, Any]:
        return {**item, "value": unpackb(item["value"])}
