"""The batched request log writes what the JSON formatter would, a little later."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from pathlib import Path

import httpx

from rlreplay.app.api.logs import ACCESS_LOGGER, AccessLog, JsonFormatter
from tests.live import running_server, stop_server

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


def test_json_lines_carry_no_terminal_escape_codes() -> None:
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, "running", None, None)
    record.__dict__["color_message"] = "\x1b[1mrunning\x1b[0m"
    record.msg = "\x1b[32mrunning\x1b[0m on %s"
    record.args = ("http://x",)
    line = JsonFormatter().format(record)
    assert "\x1b" not in line and "\\u001b" not in line
    assert json.loads(line)["msg"] == "running on http://x"


def _server_lines(tmp_path: Path, level: str) -> list[dict[str, object]]:
    """The log of a live server at ``level`` that answered the probes and one API call."""
    with running_server(tmp_path, "--storage-mode", "memory", "--log-level", level) as srv:
        for path in ("/healthz", "/readyz", "/metrics", "/v1/tables"):
            assert httpx.get(srv.url + path, timeout=10).status_code == 200
        stop_server(srv)
        text = srv.log()
    assert "\x1b" not in text and "\\u001b" not in text, text
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_live_servers_log_is_plain_json_and_probes_are_debug(tmp_path: Path) -> None:
    lines = _server_lines(tmp_path / "info", "info")
    assert any(str(x["msg"]).startswith("Uvicorn running") for x in lines)
    requests = {x["path"]: x["level"] for x in lines if x["logger"] == ACCESS_LOGGER}
    assert requests == {"/v1/tables": "info"}, requests
    lines = _server_lines(tmp_path / "debug", "debug")
    requests = {x["path"]: x["level"] for x in lines if x["logger"] == ACCESS_LOGGER}
    assert requests == {
        "/healthz": "debug",
        "/readyz": "debug",
        "/metrics": "debug",
        "/v1/tables": "info",
    }, requests


async def test_the_apps_lifespan_owns_its_access_log(tmp_path: Path) -> None:
    """Lines wait in the app's log until its lifespan ends, which writes them: no module
    state, no exit hook."""
    from rlreplay.app.api import logs
    from rlreplay.app.main import create_app
    from rlreplay.app.settings import Settings

    out = io.StringIO()
    access = AccessLog(out, delay_s=3600)
    settings = Settings(data_dir=tmp_path / "data", storage_mode="memory")
    app = create_app(settings, access_log=access)
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                for path in ("/v1/tables", "/v1/tables/nope"):
                    await client.get(path, headers={"x-request-id": path[-4:]})
            assert out.getvalue() == ""  # waiting for the timer
    finally:
        logging.getLogger(ACCESS_LOGGER).setLevel(logging.NOTSET)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(x["request_id"], x["status"]) for x in lines] == [("bles", 200), ("nope", 404)]
    access.request(**FIELDS)  # type: ignore[arg-type]  # closed: written at once
    assert len(out.getvalue().splitlines()) == 3
    assert not [v for v in vars(logs).values() if isinstance(v, AccessLog)]
