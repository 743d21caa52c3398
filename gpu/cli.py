"""``rlreplay sidecar``: the GPU sidecar's command line (the ``rlreplay`` command hands
``sidecar`` here, so that ``rlreplay serve`` never loads torch).

The sidecar keeps the server's rules for what it accepts: its own bearer keys
(``--api-key``; the key it reads the server with is ``--server-api-key``), a cap on request
bodies and on answers, and the server's connection deadlines and cap. Its log lines are the
server's JSON lines; the first one names the device it draws on.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["build_sidecar_parser", "main", "pick_device"]

log = logging.getLogger("rlreplay.gpu")

_ENV_PREFIX = "RLREPLAY_SIDECAR_"
_MB = 1 << 20
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def _positive(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{text} is not a number > 0")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{text} is not a number >= 0")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"{text} is not a whole number > 0")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"{text} is not a port (0 to 65535)")
    return value


def _switch(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(f"{text!r} is not one of 1/0, true/false, yes/no, on/off")


def _keys(text: str) -> list[str]:
    """Keys from a variable: a JSON list, or words split by commas or spaces (as the
    server's ``RLREPLAY_API_KEY``)."""
    text = text.strip()
    if text.startswith("["):
        value = json.loads(text)
        if not (isinstance(value, list) and all(isinstance(k, str) for k in value)):
            raise ValueError("a JSON list of keys must hold strings only")
        return [k for k in value if k]
    return [k for k in text.replace(",", " ").split() if k]


def _flag_type(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """``convert`` as an argparse type: its ``ValueError`` becomes argparse's message."""

    def flag_value(text: str) -> Any:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return flag_value


class _FlagKeys(argparse.Action):
    """``--api-key KEY``, repeatable: the flags' keys replace the variable's."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest)
        keys = [] if current is self.default else current
        setattr(namespace, self.dest, [*keys, values])


def build_sidecar_parser() -> argparse.ArgumentParser:
    """The parser of ``rlreplay sidecar``; each flag's default comes from
    ``RLREPLAY_SIDECAR_<FLAG>`` when set (a bad value stops it, naming the variable)."""
    parser = argparse.ArgumentParser(
        prog="rlreplay sidecar",
        description=(
            "Follow one table of a replay server into device memory, select there, and serve "
            "batches as device-collected columns: POST /v1/sample, /healthz, /readyz, /metrics. "
            f"Every flag is also a variable {_ENV_PREFIX}<FLAG> (e.g. {_ENV_PREFIX}SERVER); "
            "a flag beats the variable."
        ),
    )

    def env(dest: str, convert: Callable[[str], Any], default: Any) -> Any:
        name = _ENV_PREFIX + dest.upper()
        text = os.environ.get(name)
        if text is None:
            return default
        try:
            return convert(text)
        except ValueError as exc:
            parser.error(f"{name}={text!r}: {exc}")

    def add(flag: str, convert: Callable[[str], Any], default: Any, text: str, **kw: Any) -> None:
        dest = flag.removeprefix("--").replace("-", "_")
        value = env(dest, convert, default)
        shown = "none" if default in (None, []) else default
        if kw.get("action") is None:
            kw["type"] = _flag_type(convert)
        help_text = f"{text} [env {_ENV_PREFIX}{dest.upper()}; default: {shown}]"
        parser.add_argument(flag, default=value, help=help_text, **kw)

    server, table = env("server", str, None), env("table", str, None)
    parser.add_argument(
        "--server",
        metavar="URL",
        default=server,
        required=server is None,
        help="the replay server: http://host:port, or unix:///path/to.sock on this host",
    )
    parser.add_argument("--table", metavar="NAME", default=table, required=table is None)
    add("--device", str, "auto", "auto (cuda when torch sees a GPU, else cpu), cuda, cuda:N, cpu")
    add("--host", str, "127.0.0.1", "address to bind")
    add("--port", _port, 8001, "port to bind", metavar="N")
    add("--server-api-key", str, None, "the key the sidecar reads the server with", metavar="KEY")
    add(
        "--api-key",
        _keys,
        [],
        "the sidecar's own bearer keys: when set, /v1 needs one (repeatable)",
        action=_FlagKeys,
        metavar="KEY",
    )
    add(
        "--metrics-require-key",
        _switch,
        False,
        "with keys set, /metrics needs one too",
        action=argparse.BooleanOptionalAction,
    )
    add("--max-request-mb", _positive, 1.0, "largest request body accepted", metavar="X")
    add(
        "--max-response-mb",
        _positive,
        256.0,
        "largest answer built: a sample whose keys and values would take more is refused "
        "with 422 before it is built",
        metavar="X",
    )
    add("--request-head-timeout-s", _positive, 10.0, "seconds to send a request head", metavar="X")
    add(
        "--request-body-timeout-s",
        _positive,
        30.0,
        "window over which a request body's pace is checked",
        metavar="X",
    )
    add(
        "--request-body-min-kb-per-s",
        _non_negative,
        1.0,
        "slowest mean pace of a request body over each window, in KiB/s",
        metavar="X",
    )
    add(
        "--keep-alive-s",
        _positive,
        30.0,
        "seconds an idle keep-alive connection stays",
        metavar="X",
    )
    add(
        "--max-connections",
        _positive_int,
        512,
        "open connections past which new ones are closed at once",
        metavar="N",
    )
    add("--seed", int, None, "seed of the draws (a request's own seed beats it)", metavar="N")
    add("--log-level", str, "info", "logging level (debug, info, warning, error)")
    return parser


def pick_device(requested: str) -> tuple[torch.device, str]:
    """The device to draw on, and why: ``auto`` is CUDA when torch sees a GPU, else the CPU.

    Raises:
        ValueError: ``requested`` is no device, or a CUDA device torch does not see.
    """
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda"), f"auto: torch sees {torch.cuda.device_count()} GPU(s)"
        return torch.device("cpu"), f"auto: torch {torch.__version__} sees no CUDA device"
    try:
        device = torch.device(requested)
    except RuntimeError as exc:
        raise ValueError(f"{requested!r} is no torch device (cuda, cuda:N, cpu)") from exc
    if device.type == "cuda":
        seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if seen == 0:
            built = "" if torch.version.cuda else ", built without CUDA"
            raise ValueError(
                f"torch {torch.__version__} sees no CUDA device{built}: use --device cpu, "
                "or --device auto to take the GPU when there is one"
            )
        if device.index is not None and device.index >= seen:
            raise ValueError(f"torch sees {seen} CUDA device(s): cuda:0 to cuda:{seen - 1}")
    return device, "asked for"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the sidecar until SIGINT or SIGTERM; the exit status."""
    parser = build_sidecar_parser()
    args = parser.parse_args(argv)
    import uvicorn

    from rlreplay.gpu.connections import (
        SidecarConnectionLimits,
        guarded_protocol,
        raise_descriptor_limit,
    )
    from rlreplay.gpu.logs import configure_sidecar_logging
    from rlreplay.gpu.service import SidecarConfig, create_sidecar_app

    try:
        configure_sidecar_logging(args.log_level)
    except ValueError:
        parser.error(f"--log-level {args.log_level!r}: use debug, info, warning or error")
    try:
        device, why = pick_device(args.device)
    except ValueError as exc:
        parser.error(f"--device {args.device}: {exc}")
    log.info(
        "sidecar: drawing on %s (%s)",
        device,
        why,
        extra={"device": str(device), "server": args.server, "table": args.table},
    )
    limits = SidecarConnectionLimits(
        head_timeout_s=args.request_head_timeout_s,
        body_timeout_s=args.request_body_timeout_s,
        body_min_bytes_per_s=args.request_body_min_kb_per_s * 1024,
        max_connections=args.max_connections,
    )
    raise_descriptor_limit(args.max_connections)
    config = SidecarConfig(
        args.server,
        args.table,
        str(device),
        # compose passes an unset key as an empty variable: no key, not an empty one
        server_api_key=args.server_api_key or None,
        seed=args.seed,
        api_keys=tuple(k for k in args.api_key if k),
        metrics_require_key=args.metrics_require_key,
        max_request_bytes=int(args.max_request_mb * _MB),
        max_response_bytes=int(args.max_response_mb * _MB),
    )
    uvicorn.run(
        create_sidecar_app(config),
        host=args.host,
        port=args.port,
        log_config=None,
        log_level=args.log_level.lower(),
        lifespan="on",
        # asyncio's own loop: the client following the table reads large answers with less
        # CPU there than on uvloop (measured with stream(); both loops work)
        loop="asyncio",
        http=guarded_protocol(limits),
        ws="none",
        timeout_keep_alive=args.keep_alive_s,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=5,
    )
    return 0
