"""The idempotency window: request ids of the writes answered lately, and their answers.

A write that carries a ``request_id`` (push, patch, deletes) is answered once; a repeat of
the id for the same kind of write within the window gets the first answer and changes
nothing, and a repeat that comes while the first is still in flight waits for it. An id
is kept for ``window_s`` (10 minutes) and, however old, while it is among the newest
``keep`` (100,000). The ids are durable: the log records each write's id (replay remembers
it again) and every checkpoint saves the window (:meth:`RequestIds.state`, in RocksDB or
the memory checkpoint), so a retry after a restart is recognised too.

The window keeps what happened to a write, never how HTTP says it: an answer body, whose
:class:`AnswerKind` (committed or accepted) the API layer turns into a status
(:mod:`rlreplay.app.api.write_status`). The log's request record and a checkpoint's window
carry the kind's name beside the body; files written before the kind was named carry a
number there, which reading ignores: the body says the same.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Answer", "AnswerKind", "RequestIds", "answer_count", "answer_kind", "scoped_id"]

#: A write's answer body as the window keeps it: ``{"committed": n}`` once applied, else
#: ``{"accepted": n}`` (a patch adds ``"missing"``).
Answer = dict[str, Any]


class AnswerKind(enum.Enum):
    """What happened to a write before it was answered."""

    COMMITTED = "committed"  #: applied by the writer (the write asked to wait)
    ACCEPTED = "accepted"  #: admitted (logged, with the log on) and queued for the writer


def answer_kind(body: Answer) -> AnswerKind:
    """The kind of a write's answer ``body``: the key it counts under."""
    return AnswerKind.COMMITTED if "committed" in body else AnswerKind.ACCEPTED


@dataclass(slots=True, eq=False)
class _Entry:
    at: float  # unix time of the first request
    answer: Answer | None = None  # None while the first request is in flight
    done: asyncio.Future[Answer] | None = field(default=None)


def answer_count(body: dict[str, Any]) -> int:
    """The count a write's answer body gives: ``committed`` or ``accepted``."""
    return int(body.get("committed", body.get("accepted")) or 0)


def scoped_id(kind: str, request_id: str) -> str:
    """The window's key of ``request_id`` for a write of ``kind`` (push, patch, delete): an
    id names one request of one kind, so a patch never gets a push's answer."""
    return f"{kind}:{request_id}"


class RequestIds:
    """Request ids and the answers they got (see the module docstring)."""

    def __init__(self, *, window_s: float = 600.0, keep: int = 100_000) -> None:
        self.window_s = window_s
        self.keep = keep
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def begin(self, request_id: str) -> asyncio.Future[Answer] | Answer | None:
        """Note a request id about to be served: None when it is new (the caller serves it,
        then calls :meth:`finish` or :meth:`forget`); else the first answer, or a future
        of it while the first request is in flight."""
        entry = self._entries.get(request_id)
        if entry is not None:
            if entry.answer is not None:
                return entry.answer
            if entry.done is None:
                entry.done = asyncio.get_running_loop().create_future()
            return entry.done
        self._trim(time.time())
        self._entries[request_id] = _Entry(time.time())
        return None

    def finish(self, request_id: str, answer: Answer) -> None:
        """The first request of ``request_id`` was answered ``answer``."""
        entry = self._entries.get(request_id)
        if entry is None:
            self.remember(request_id, answer, time.time())
            return
        entry.answer = answer
        if entry.done is not None and not entry.done.done():
            entry.done.set_result(answer)

    def forget(self, request_id: str, exc: BaseException) -> None:
        """The first request of ``request_id`` was refused (it changed nothing): repeats
        waiting for it get the same error, and a later one is served anew."""
        entry = self._entries.pop(request_id, None)
        if entry is not None and entry.done is not None and not entry.done.done():
            entry.done.set_exception(exc)
            entry.done.exception()  # retrieved: a waiter may have gone

    def remember(self, request_id: str, answer: Answer, at: float) -> None:
        """An id answered before (the log's replay, a checkpoint's window)."""
        entry = self._entries.get(request_id)
        if entry is None:
            self._entries[request_id] = _Entry(at, answer)
        elif entry.answer is None:
            entry.answer = answer

    def _trim(self, now: float) -> None:
        entries = self._entries
        excess = len(entries) - self.keep
        horizon = now - self.window_s
        while excess > 0:
            request_id, entry = next(iter(entries.items()))
            if entry.at >= horizon or entry.answer is None:
                break
            del entries[request_id]
            excess -= 1

    def state(self) -> list[list[Any]]:
        """The answered ids, oldest first: ``[[id, at, kind, body], ...]`` (``kind``: the
        :class:`AnswerKind`'s value)."""
        self._trim(time.time())
        return [
            [rid, e.at, answer_kind(e.answer).value, e.answer]
            for rid, e in self._entries.items()
            if e.answer is not None
        ]

    def load(self, state: list[list[Any]]) -> None:
        """Remember the ids of :meth:`state` (the kind is read from each body)."""
        for rid, at, _kind, body in state:
            self.remember(str(rid), dict(body), float(at))
