"""The idempotency window: request ids of the writes answered lately, and their answers.

A write that carries a ``request_id`` (push, patch, deletes) is answered once; a repeat of
the id for the same kind of write within the window gets the first answer and changes
nothing, and a repeat that comes while the first is still in flight waits for it. An id
is kept for ``window_s`` (10 minutes) and, however old, while it is among the newest
``keep`` (100,000; older ones are dropped 1,024 at a time). The ids are durable: the log
records each write's id (replay remembers it again) and every checkpoint saves the window
(:meth:`RequestIds.state`, in RocksDB or the memory checkpoint), so a retry after a
restart is recognised too.

RocksDB keeps the window one key per id (:mod:`rlreplay.app.storage.layout`), and a
checkpoint writes only what changed since the last one (:meth:`RequestIds.take_changes`):
the ids answered since, and deletes for the ids dropped since, so its work follows the
writes of one interval, not the window (which grows to 10 minutes of writes). Memory
mode writes the whole window into its file (:meth:`RequestIds.snapshot`), as it writes
the tables.

The window keeps what happened to a write, never how HTTP says it: an answer body, whose
:class:`AnswerKind` (committed or accepted) the API layer turns into a status
(:mod:`rlreplay.app.api.write_status`). The log's request record and a checkpoint's window
carry the kind's name beside the body; files written before the kind was named carry a
number there, which reading ignores: the body says the same.

The window can hold 100,000 answers, and the event loop must not feel them: an answered
id costs the garbage collector nothing (its time and its answer body, a dict of a string
and a count, sit in two dicts, where an object per id would be walked by every
collection until it leaves the window). A RocksDB checkpoint reads the rows of the ids
that changed, a slice at a time on the loop (:mod:`rlreplay.app.writer.window_keys`);
memory mode's takes a :class:`WindowSnapshot` on the loop (three list copies) and packs
it in an I/O thread, a slice at a time (:meth:`WindowSnapshot.packed`).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

__all__ = [
    "Answer",
    "AnswerKind",
    "RequestIds",
    "WindowChanges",
    "WindowSnapshot",
    "answer_count",
    "answer_kind",
    "scoped_id",
]

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
class _InFlight:
    """An id whose first request is being served."""

    answer: Answer | None = None  # set only by :meth:`RequestIds.remember` (replay)
    done: asyncio.Future[Answer] | None = field(default=None)


#: Answered ids packed per call in :meth:`WindowSnapshot.packed`.
_PACK_SLICE = 2048
#: Ids past ``keep`` dropped at once (see :meth:`RequestIds._trim`).
_TRIM_BATCH = 1024
#: Changes noted since the last save, past which the next save writes the whole window
#: instead (a multiple of the window's size, see :meth:`RequestIds._note`): what bounds
#: the lists when no checkpoint takes them for long.
_CHANGES_PER_ID = 4


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
        #: id -> unix time of its first request, oldest first (a plain dict: it copies
        #: to a list many times faster than an OrderedDict, see :meth:`snapshot`)
        self._at: dict[str, float] = {}
        #: id -> its answer, or its entry while in flight; the same ids in the same order
        #: (both gain and lose an id together; a new value keeps its key's place)
        self._answer: dict[str, Answer | _InFlight] = {}
        #: What changed since the last save (:meth:`take_changes`): the ids gained (an id
        #: in flight stays here until answered) and the ids dropped; or, once these lists
        #: grew past :data:`_CHANGES_PER_ID` times the window, ``_whole``: the next save
        #: writes the whole window.
        self._gained: list[str] = []
        self._lost: list[str] = []
        self._whole = False

    def __len__(self) -> int:
        return len(self._at)

    def begin(self, request_id: str) -> asyncio.Future[Answer] | Answer | None:
        """Note a request id about to be served: None when it is new (the caller serves it,
        then calls :meth:`finish` or :meth:`forget`); else the first answer, or a future
        of it while the first request is in flight."""
        entry = self._answer.get(request_id)
        if entry is not None:
            if not isinstance(entry, _InFlight):
                return entry
            if entry.answer is not None:
                return entry.answer
            if entry.done is None:
                entry.done = asyncio.get_running_loop().create_future()
            return entry.done
        now = time.time()
        self._trim(now)
        self._at[request_id] = now
        self._answer[request_id] = _InFlight()
        self._gained.append(request_id)
        self._note()
        return None

    def finish(self, request_id: str, answer: Answer) -> None:
        """The first request of ``request_id`` was answered ``answer``."""
        entry = self._answer.get(request_id)
        if entry is None:
            self.remember(request_id, answer, time.time())
            return
        self._answer[request_id] = answer  # replaced, not changed: see WindowSnapshot
        if isinstance(entry, _InFlight) and entry.done is not None and not entry.done.done():
            entry.done.set_result(answer)

    def forget(self, request_id: str, exc: BaseException) -> None:
        """The first request of ``request_id`` was refused (it changed nothing): repeats
        waiting for it get the same error, and a later one is served anew."""
        self._at.pop(request_id, None)
        entry = self._answer.pop(request_id, None)
        if entry is not None and _answer_of(entry) is not None:  # saved, maybe
            self._lost.append(request_id)
        if not isinstance(entry, _InFlight):
            return
        if entry.done is not None and not entry.done.done():
            entry.done.set_exception(exc)
            entry.done.exception()  # retrieved: a waiter may have gone

    def remember(self, request_id: str, answer: Answer, at: float, *, saved: bool = False) -> None:
        """An id answered before (the log's replay, a checkpoint's window); ``saved``: read
        from RocksDB's keys of the window, which need not be written again."""
        entry = self._answer.get(request_id)
        if entry is None:
            self._at[request_id] = at
            self._answer[request_id] = answer
            if not saved:
                self._gained.append(request_id)
                self._note()
        elif isinstance(entry, _InFlight) and entry.answer is None:
            entry.answer = answer

    def _trim(self, now: float) -> None:
        """Drop the oldest ids past ``keep`` that are out of the window, once
        :data:`_TRIM_BATCH` of them are past it: a dict finds its first key by walking
        past the ones deleted before it, so one walk per batch."""
        at_of, answers = self._at, self._answer
        excess = len(at_of) - self.keep
        if excess < _TRIM_BATCH:
            return
        horizon = now - self.window_s
        doomed = []
        for request_id, at in itertools.islice(at_of.items(), excess):
            entry = answers[request_id]
            if at >= horizon or (isinstance(entry, _InFlight) and entry.answer is None):
                break
            doomed.append(request_id)
        for request_id in doomed:
            del at_of[request_id], answers[request_id]
        self._lost.extend(doomed)

    def _note(self) -> None:
        """Past :data:`_CHANGES_PER_ID` changes per id of the window (no checkpoint took
        them for long), the next save writes the whole window instead: the lists would
        otherwise hold every id ever dropped."""
        if len(self._gained) + len(self._lost) > _CHANGES_PER_ID * max(len(self._at), _TRIM_BATCH):
            self._gained, self._lost, self._whole = [], [], True

    def take_changes(self) -> WindowChanges:
        """What changed since the last save, handed to a checkpoint (which writes it
        with :meth:`rows`, or gives it back with :meth:`give_back` if it fails)."""
        if self._whole:
            self._trim(time.time())
            changes = WindowChanges(list(self._at), [], whole=True)
        else:
            changes = WindowChanges(self._gained, self._lost, whole=False)
        self._gained, self._lost, self._whole = [], [], False
        return changes

    def give_back(self, changes: WindowChanges) -> None:
        """A save of ``changes`` failed: the next one writes them (and what came since)."""
        if changes.whole:
            self._whole = True
            return
        self._gained[:0] = changes.gained
        self._lost[:0] = changes.lost
        self._note()

    def rows(self, gained: list[str]) -> list[tuple[str, float, str, Answer]]:
        """The rows ``(id, at, kind, body)`` of the ids of ``gained`` (a slice of a
        :class:`WindowChanges`') answered now: those still in flight are gained again, for
        the next save; those dropped meanwhile are left out (their drop is noted)."""
        committed, accepted = AnswerKind.COMMITTED.value, AnswerKind.ACCEPTED.value
        at_of, answers = self._at, self._answer
        out = []
        for request_id in gained:
            entry = answers.get(request_id)
            if entry is None:
                continue
            answer = _answer_of(entry)
            if answer is None:
                self._gained.append(request_id)
                continue
            kind = committed if "committed" in answer else accepted
            out.append((request_id, at_of[request_id], kind, answer))
        return out

    def state(self) -> list[list[Any]]:
        """The answered ids, oldest first: ``[[id, at, kind, body], ...]`` (``kind``: the
        :class:`AnswerKind`'s value)."""
        self._trim(time.time())
        return [
            [rid, at, answer_kind(answer).value, answer]
            for rid, at, answer in zip(
                self._at, self._at.values(), map(_answer_of, self._answer.values()), strict=True
            )
            if answer is not None
        ]

    def snapshot(self) -> WindowSnapshot:
        """The answered ids as of now, for :meth:`WindowSnapshot.packed` to pack off the
        event loop (what :meth:`state` gives, without building it on the loop)."""
        self._trim(time.time())
        # the whole window is saved: nothing is left to save by changes (memory mode)
        self._gained, self._lost, self._whole = [], [], False
        return WindowSnapshot(list(self._at), list(self._at.values()), list(self._answer.values()))

    def load(self, state: list[list[Any]]) -> None:
        """Remember the ids of :meth:`state` (the kind is read from each body)."""
        for rid, at, _kind, body in state:
            self.remember(str(rid), dict(body), float(at))


def _answer_of(entry: Answer | _InFlight) -> Answer | None:
    return entry.answer if isinstance(entry, _InFlight) else entry


@dataclass(slots=True)
class WindowChanges:
    """What the window gained and lost between two saves (see
    :meth:`RequestIds.take_changes`): the ids gained, answered or not yet (their rows are
    read when written, :meth:`RequestIds.rows`), and the ids dropped; or, ``whole``, every
    id of the window in ``gained``, to be written in place of all the saved ones."""

    gained: list[str]
    lost: list[str]
    whole: bool


class WindowSnapshot:
    """The window's ids, times and answers at one moment (list copies: the window goes on
    changing). An answer replaces its id's in-flight entry rather than changing it, so an
    id answered after the snapshot stays unanswered in it."""

    def __init__(self, ids: list[str], ats: list[float], answers: list[Answer | _InFlight]) -> None:
        self._ids = ids
        self._ats = ats
        self._answers = answers

    def packed(self) -> bytes:
        """The msgpack of :meth:`RequestIds.state` at the snapshot (blocking: run it in an
        I/O thread). Each call into msgpack packs :data:`_PACK_SLICE` ids, so the GIL
        changes hands between slices."""
        packer = msgpack.Packer()
        committed, accepted = AnswerKind.COMMITTED.value, AnswerKind.ACCEPTED.value
        parts: list[bytes] = []
        count = 0
        for at in range(0, len(self._ids), _PACK_SLICE):
            cut = slice(at, at + _PACK_SLICE)
            rows = [
                (rid, when, committed if "committed" in answer else accepted, answer)
                for rid, when, answer in zip(
                    self._ids[cut],
                    self._ats[cut],
                    map(_answer_of, self._answers[cut]),
                    strict=True,
                )
                if answer is not None
            ]
            # a slice packs as an array: its elements are what the whole array holds
            parts.append(packer.pack(rows)[len(packer.pack_array_header(len(rows))) :])
            count += len(rows)
        head: bytes = packer.pack_array_header(count)
        return head + b"".join(parts)
