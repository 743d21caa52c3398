"""The sidecar's log lines are the server's: the same record renders to the same JSON line
with both formatters (the sidecar may not import the server's HTTP layer, so it keeps a
copy, and this test keeps the two alike)."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from rlreplay.app.api.logs import JsonFormatter
from rlreplay.gpu.logs import SidecarLogFormatter


def record(msg: str, *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            info = sys.exc_info()
    made = logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, msg, args, info)
    made.__dict__.update(extra)
    made.created = 1_700_000_000.123456
    return made


@pytest.mark.parametrize(
    "made",
    [
        record("plain %s", "text"),
        record("sidecar: drawing on %s", "cpu", device="cpu", table="t", count=3),
        record(
            "Uvicorn running on %s",
            "http://127.0.0.1:1",
            color_message="Uvicorn running on \x1b[1m%s\x1b[0m",
        ),
        record("\x1b[31mred\x1b[0m and Ünïcode", path="\x1b[32m/v1\x1b[0m"),
        record("failed", exc=True, request_id="abc"),
    ],
    ids=["plain", "extras", "color_message", "escapes", "traceback"],
)
def test_a_record_renders_as_the_server_renders_it(made: logging.LogRecord) -> None:
    line = SidecarLogFormatter().format(made)
    assert line == JsonFormatter().format(made)
    entry = json.loads(line)
    assert entry["ts"] == "2023-11-14T22:13:20.123Z"
    assert "\x1b" not in line and "color_message" not in entry
