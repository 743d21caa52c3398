"""Structured logs: one JSON object per line, on stderr.

The request log (logger ``rlreplay.access``) writes one line per answered request with its
request id, route, status and duration; uvicorn's own loggers go through the same formatter.
The probes (``/healthz``, ``/readyz``, ``/metrics``) are logged at ``debug``: a load balancer
polling them every second would otherwise bury the requests people look for. A line never
carries terminal escape codes: uvicorn's ``color_message`` extra is dropped and colours in a
message are stripped, so the lines stay plain JSON for log collectors.

An app given an :class:`AccessLog` (``rlreplay serve`` gives it one on stderr) writes its
request lines there rather than through the ``logging`` machinery: the same JSON text, the
lines of up to 50 ms written at once, because a ``LogRecord``, a handler lock and a ``write``
per request are a visible share of a small push (``python -m bench.http`` measures it). The
app's lifespan closes it, writing what waits; the lines of the last 50 ms before a crash
can be lost. The ``rlreplay.access`` logger's level still turns them on and off.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import time
from json.encoder import encode_basestring
from typing import Any, TextIO

__all__ = [
    "ACCESS_LOGGER",
    "PROBE_PATHS",
    "AccessLog",
    "JsonFormatter",
    "configure_logging",
    "request_level",
]

ACCESS_LOGGER = "rlreplay.access"
#: Requests logged at ``debug``: health checks and scrapes, polled by machines.
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

#: Attributes every ``LogRecord`` has; anything else on a record came in through ``extra``
#: (but uvicorn's ``color_message``, the message again with terminal colours, is left out).
_RESERVED = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "color_message"}
)
#: A terminal escape sequence (colours, cursor moves).
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
#: One encoder for every line: ``json.dumps`` with options builds a new one per call.
_ENCODER = json.JSONEncoder(default=str, ensure_ascii=False)


class _Clock:
    """UTC timestamps with milliseconds; the text of the current second is kept."""

    def __init__(self) -> None:
        self._second = -1
        self._second_text = ""

    def text(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._second_text}.{int((created - second) * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: ``ts``, ``level``, ``logger``, ``msg``, extras."""

    def __init__(self) -> None:
        """A formatter with no timestamp formatted yet."""
        super().__init__()
        self._clock = _Clock()

    def format(self, record: logging.LogRecord) -> str:
        """Renders ``record`` (and its traceback, if any) as a single JSON line, with no
        terminal escape codes."""
        entry: dict[str, Any] = {
            "ts": self._clock.text(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _plain(record.getMessage()),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key[0] != "_":
                entry[key] = _plain(value) if isinstance(value, str) else value
        if record.exc_info:
            entry["exc"] = _plain(self.formatException(record.exc_info))
        return _ENCODER.encode(entry)


def _plain(text: str) -> str:
    """``text`` without terminal escape sequences."""
    return _ESCAPE.sub("", text) if "\x1b" in text else text


def request_level(path: str) -> int:
    """The level of a request's log line: ``debug`` for the probes, ``info`` otherwise."""
    return logging.DEBUG if path in PROBE_PATHS else logging.INFO


def _json(value: str | None) -> str:
    return "null" if value is None else encode_basestring(value)


class AccessLog:
    """Request lines, rendered as :class:`JsonFormatter` renders them, written in batches.

    Lines wait at most ``delay_s`` (a timer on the running event loop) and are written with
    one ``write`` and ``flush``; without a running loop, or once closed, a line is written
    at once. The app that holds it closes it when its lifespan ends.
    """

    def __init__(self, stream: TextIO, *, delay_s: float = 0.05) -> None:
        """Writes to ``stream``.

        Args:
            stream: Where the lines go.
            delay_s: How long a line may wait for others.
        """
        self._stream = stream
        self._delay_s = delay_s
        self._lines: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._clock = _Clock()
        self._closed = False

    def request(
        self,
        *,
        request_id: str,
        method: str,
        path: str,
        route: str | None,
        status: int,
        error_code: str | None,
        duration_ms: float,
        client: str | None,
    ) -> None:
        """Adds one request's line (the fields of the ``rlreplay.access`` records); a probe's
        line only when the ``rlreplay.access`` logger is enabled for ``debug``."""
        level = "info"
        if path in PROBE_PATHS:
            if not logging.getLogger(ACCESS_LOGGER).isEnabledFor(logging.DEBUG):
                return
            level = "debug"
        self._lines.append(
            f'{{"ts": "{self._clock.text(time.time())}", "level": "{level}", '
            f'"logger": "{ACCESS_LOGGER}", "msg": "request", '
            f'"request_id": {_json(request_id)}, "method": {_json(method)}, '
            f'"path": {_json(path)}, "route": {_json(route)}, "status": {status}, '
            f'"error_code": {_json(error_code)}, "duration_ms": {duration_ms!r}, '
            f'"client": {_json(client)}}}\n'
        )
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is None or self._closed:
                self.flush()
                return
            self._timer = loop.call_later(self._delay_s, self.flush)

    def flush(self) -> None:
        """Writes the waiting lines."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._lines:
            text = "".join(self._lines)
            self._lines.clear()
            self._stream.write(text)
            self._stream.flush()

    def close(self) -> None:
        """Writes the waiting lines; later lines are written at once. Calling it again
        does nothing more."""
        self._closed = True
        self.flush()


def configure_logging(level: str = "info") -> None:
    """Sends every log record of the process to stderr as JSON lines, at ``level``.

    For the process that serves (``rlreplay serve``): it replaces the root logger's
    handlers. The request lines go wherever the app's :class:`AccessLog` writes.

    Args:
        level: A logging level name (``debug``, ``info``, ``warning``...).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
