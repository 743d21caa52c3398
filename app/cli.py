"""The ``rlreplay`` command: ``serve`` runs the service, ``export`` writes a table of a
snapshot out for analysis, ``sidecar`` the GPU sidecar.

Every flag of ``serve`` is a field of :class:`rlreplay.app.settings.Settings` and also the
environment
variable ``RLREPLAY_<FIELD>``; a flag given on the command line beats the variable, because
only the flags actually given are passed to ``Settings`` and pydantic-settings fills the
rest from the environment.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from rlreplay.app import package_version
from rlreplay.app.export import add_export_parser, run_export
from rlreplay.app.settings import Settings

__all__ = ["build_parser", "main", "serve_command", "settings_from_args", "uvicorn_options"]

_ENV_PREFIX = "RLREPLAY_"
#: The options of uvicorn that no setting changes.
_UVICORN_FIXED: dict[str, Any] = {
    "loop": "auto",
    "ws": "none",
    "lifespan": "on",
    "workers": 1,
    "access_log": False,
    "server_header": False,
}
_NONE_WORDS = frozenset({"none", "null", ""})


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """``(inner type, optional)`` of ``X | None``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _optional_value(text: str) -> str | None:
    return None if text.strip().lower() in _NONE_WORDS else text


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _add_setting(group: argparse._ArgumentGroup, name: str, field: FieldInfo) -> None:
    """Adds the flag of one settings field; its default is left out so unset flags stay unset."""
    annotation, optional = _unwrap_optional(field.annotation)
    env = _ENV_PREFIX + name.upper()
    default = field.get_default(call_default_factory=True)
    shown = (
        "none"
        if default is None
        else (json.dumps(default) if isinstance(default, dict | list) else str(default))
    )
    help_text = f"{field.description or name} [env {env}; default: {shown}]"
    kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
    origin = typing.get_origin(annotation)
    if annotation is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif origin is list:
        kwargs.update(action="append", metavar=name.upper().removesuffix("S"))
        kwargs["help"] = help_text + " (repeatable)"
    elif origin is dict or annotation is dict:
        kwargs.update(type=_json_object, metavar="JSON")
    elif origin is Literal:
        kwargs["choices"] = [str(c) for c in typing.get_args(annotation)]
    else:
        if optional:
            kwargs["type"] = _optional_value
            kwargs["help"] = help_text + " ('none' to unset)"
        metavar = {int: "N", float: "X", Path: "DIR"}.get(annotation, name.upper())
        kwargs["metavar"] = metavar
    group.add_argument(_flag(name), **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``rlreplay``, its ``serve`` flags generated from the settings' fields."""
    parser = argparse.ArgumentParser(
        prog="rlreplay",
        description="rlreplay: an experience replay service for reinforcement learning over HTTP.",
        epilog="Run 'rlreplay serve --help' for the server's flags.",
    )
    parser.add_argument("--version", action="version", version=f"rlreplay {package_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the replay service (HTTP API, docs at /docs)",
        description=(
            "Run the replay service. Every flag is also an environment variable "
            f"{_ENV_PREFIX}<FLAG NAME> (e.g. RLREPLAY_BACKUP_URL); a flag beats the variable."
        ),
    )
    group = serve.add_argument_group("settings")
    for name, field in Settings.model_fields.items():
        _add_setting(group, name, field)
    # listed for --help; the rlreplay command (rlreplay.command) runs it, from rlreplay.gpu
    commands.add_parser(
        "sidecar",
        help="run the GPU sidecar for one table ('rlreplay sidecar --help'; needs torch)",
        add_help=False,
    )
    add_export_parser(commands)
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    """``Settings`` from the flags given; the environment fills in the rest.

    Args:
        args: Parsed ``serve`` arguments (unset flags are absent from the namespace).

    Returns:
        The settings.

    Raises:
        ValidationError: A flag or variable has an invalid value.
    """
    given = {k: v for k, v in vars(args).items() if k in Settings.model_fields}
    return Settings(**given)


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """How ``rlreplay serve`` runs uvicorn (``bench.http`` serves its ceiling app the same
    way): the fixed options, uvicorn's keep-alive timeout, and the HTTP protocol of
    :mod:`rlreplay.app.api.connections` with the connection settings.

    Args:
        settings: The settings.

    Returns:
        Keyword arguments of ``uvicorn.Config`` (or ``uvicorn.run``).
    """
    from rlreplay.app.api.connections import BODY_HOLD_BYTES, ConnectionLimits, guarded_protocol

    limits = ConnectionLimits(
        head_timeout_s=settings.request_head_timeout_s,
        body_timeout_s=settings.request_body_timeout_s,
        body_min_bytes_per_s=settings.request_body_min_kb_per_s * 1024,
        max_connections=settings.max_connections,
        # a chunked body past the limit reaches the middleware, which refuses it, at once
        body_hold_bytes=min(BODY_HOLD_BYTES, int(settings.max_request_mb * 1024 * 1024)),
    )
    return {
        **_UVICORN_FIXED,
        "http": guarded_protocol(limits),
        "timeout_keep_alive": settings.keep_alive_s,
    }


def serve_command(port: int, data_dir: Path, *flags: str) -> list[str]:
    """The command line of ``python -m rlreplay.app`` serving on 127.0.0.1:``port`` (the live tests
    and the HTTP benchmark start their servers with it)."""
    return [
        sys.executable,
        "-m",
        "rlreplay.app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *flags,
    ]


def _serve(settings: Settings) -> int:
    import uvicorn

    from rlreplay.app.api.connections import raise_descriptor_limit
    from rlreplay.app.api.logs import configure_logging
    from rlreplay.app.main import create_app

    configure_logging(settings.log_level)
    raise_descriptor_limit(settings.max_connections)
    failures: list[BaseException] = []

    def stop_serving(exc: BaseException) -> None:
        failures.append(exc)
        server.should_exit = True

    app = create_app(
        settings,
        hot_routes=settings.hot_routes,
        tune_gc_after_start=True,
        recover_in_background=True,
        on_recovery_failure=stop_serving,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level.lower(),
        # requests in flight get this long after SIGTERM; then the engine's own stop
        # (--stop-timeout-s with the log on), so a stop always ends within seconds
        timeout_graceful_shutdown=5,
        **uvicorn_options(settings),
    )
    server = uvicorn.Server(config)
    server.run()
    if failures:
        return 3  # uvicorn's status for a failed start-up
    return 0 if server.started else 1


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``rlreplay`` console script.

    Args:
        argv: The arguments (``sys.argv[1:]`` when None).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sidecar"]:  # listed in --help; rlreplay.command runs it
        print(
            "rlreplay sidecar runs through the rlreplay command (rlreplay.command)", file=sys.stderr
        )
        raise SystemExit(2)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "export":
        raise SystemExit(run_export(args))
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        problems = "; ".join(
            f"{_flag(str(e['loc'][0])) if e['loc'] else 'settings'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        parser.exit(2, f"rlreplay serve: error: {problems}\n")
    raise SystemExit(_serve(settings))
