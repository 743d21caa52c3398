"""The sidecar's log lines: one JSON object per line on stderr, as ``rlreplay serve`` writes
them (``ts``, ``level``, ``logger``, ``msg``, then the record's extras).

The service's formatter lives in its HTTP layer, which the sidecar may not import; this is
the same format, kept so by a test that renders one record with both. uvicorn's loggers go
through it too; its ``color_message`` extra is left out and escape codes are stripped, so a
line is plain JSON for log collectors.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

__all__ = ["SidecarLogFormatter", "configure_sidecar_logging"]

#: Attributes every ``LogRecord`` has; anything else on a record came in through ``extra``
#: (but uvicorn's ``color_message``, the message again with terminal colours).
_RESERVED = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "color_message"}
)
#: A terminal escape sequence (colours, cursor moves).
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
_ENCODER = json.JSONEncoder(default=str, ensure_ascii=False)


def _plain(text: str) -> str:
    return _ESCAPE.sub("", text) if "\x1b" in text else text


class SidecarLogFormatter(logging.Formatter):
    """Formats a record as one JSON line: ``ts`` (UTC, ms), ``level``, ``logger``, ``msg``,
    extras, and ``exc`` with a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        """Renders ``record`` as a single JSON line without terminal escape codes."""
        second = int(record.created)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        entry: dict[str, Any] = {
            "ts": f"{stamp}.{int((record.created - second) * 1000):03d}Z",
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


def configure_sidecar_logging(level: str) -> None:
    """Sends every record of the process to stderr as JSON lines, at ``level``.

    Raises:
        ValueError: ``level`` is no logging level.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SidecarLogFormatter())
    root = logging.getLogger()
    root.setLevel(level.upper())  # first: an unknown level leaves the handlers alone
    root.handlers[:] = [handler]
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
