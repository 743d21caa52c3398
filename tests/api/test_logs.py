"""The batched request log writes what the JSON formatter would, a little later."""

from __future__ import annotations

import asyncio
import io
import json
import logging

from rlreplay.app.api.logs import ACCESS_LOGGER, AccessLog, JsonFormatter

FIELDS = {
    "request_id": "req-1",
    "method": "POST",
    "path": '/v1/tables/t/items/a "quoted" kéy\\',
    "route": "/v1/tables/{table}/items",
    "status": 202,
    "error_code": None,
    "duration_ms": 0.123,
    "client": "127.0.0.1:5000",
}


def _formatter_line() -> str:
    record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 1, "request", None, None)
    record.__dict__.update(FIELDS)
    return JsonFormatter().format(record)


def test_line_is_the_formatters_line() -> None:
    out = io.StringIO()
    AccessLog(out).request(**FIELDS)  # type: ignore[arg-type]
    text = out.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1
    ours, theirs = json.loads(text), json.loads(_formatter_line())
    assert ours.pop("ts")[-1] == "Z"
    theirs.pop("ts")
    assert ours == theirs
    # Same spacing as the formatter, byte for byte after the timestamp.
    assert text.rstrip("\n").split('Z", ', 1)[1] == _formatter_line().split('Z", ', 1)[1]


async def test_lines_wait_for_the_timer_then_go_out_together() -> None:
    out = io.StringIO()
    log = AccessLog(out, delay_s=0.05)
    log.request(**FIELDS)  # type: ignore[arg-type]
    log.request(**{**FIELDS, "request_id": "req-2", "error_code": "overloaded"})  # type: ignore[arg-type]
    assert out.getvalue() == ""
    await asyncio.sleep(0.2)
    lines = out.getvalue().splitlines()
    assert [json.loads(x)["request_id"] for x in lines] == ["req-1", "req-2"]
    assert json.loads(lines[1])["error_code"] == "overloaded"
    log.flush()
    assert len(out.getvalue().splitlines()) == 2
