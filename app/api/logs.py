"""Structured logs: one JSON object per line, on stderr.

The request log (logger ``rlreplay.access``) writes one line per answered request with its
request id, route, status and duration; uvicorn's own loggers go through the same formatter.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["ACCESS_LOGGER", "JsonFormatter", "configure_logging"]

ACCESS_LOGGER = "rlreplay.access"

#: Attributes every ``LogRecord`` has; anything else on a record came in through ``extra``.
_RESERVED = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)
#: One encoder for every line: ``json.dumps`` with options builds a new one per call.
_ENCODER = json.JSONEncoder(default=str, ensure_ascii=False)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: ``ts``, ``level``, ``logger``, ``msg``, extras.

    It runs for every request (the access log), so the ``ts`` text of the current second is
    kept and only the milliseconds are formatted per line.
    """

    def __init__(self) -> None:
        """A formatter with no timestamp formatted yet."""
        super().__init__()
        self._second = -1
        self._second_text = ""

    def _timestamp(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._second_text}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        """Renders ``record`` (and its traceback, if any) as a single JSON line."""
        entry: dict[str, Any] = {
            "ts": self._timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key[0] != "_":
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return _ENCODER.encode(entry)


def configure_logging(level: str = "info") -> None:
    """Sends every log record of the process to stderr as JSON lines, at ``level``.

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
