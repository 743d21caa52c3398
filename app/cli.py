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
import difflib
import json
import re
import socket
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import SettingsError

from rlreplay.app import package_version
from rlreplay.app.backup import BackupStore
from rlreplay.app.backup.manifest import check_snapshot_id
from rlreplay.app.export import add_export_parser, run_export
from rlreplay.app.settings import Settings
from rlreplay.app.storage.data_dir_lock import DataDirInUse, DataDirLock

__all__ = [
    "UsageError",
    "build_parser",
    "main",
    "preflight",
    "serve_command",
    "settings_from_args",
    "uvicorn_options",
]

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
        max_direct_body_bytes=int(settings.max_request_mb * 1024 * 1024),
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


class UsageError(Exception):
    """A mistake in what the user asked for: reported as one line, exit status 2."""


def _where(name: str, given: set[str]) -> str:
    """Where a setting came from: its flag when given, else its environment variable."""
    return _flag(name) if name in given else _ENV_PREFIX + name.upper()


def _settings_problem(exc: ValidationError, given: set[str]) -> str:
    """One line naming each bad setting by the flag or variable that set it."""
    problems = []
    for e in exc.errors(include_url=False):
        msg = str(e["msg"]).removeprefix("Value error, ")
        if not e["loc"]:
            problems.append(msg)
            continue
        name = str(e["loc"][0])
        where = _where(name, given)
        shown = f"{where}={e['input']!r}" if name not in given and "input" in e else where
        problems.append(f"{shown}: {msg}")
    return "; ".join(problems)


def _load_settings(args: argparse.Namespace) -> Settings:
    """:func:`settings_from_args`, its errors as :class:`UsageError`."""
    given = {k for k in vars(args) if k in Settings.model_fields}
    try:
        return settings_from_args(args)
    except ValidationError as exc:
        raise UsageError(_settings_problem(exc, given)) from exc
    except SettingsError as exc:  # a variable of a JSON field that is not JSON
        field = re.search(r'field "(\w+)"', str(exc))
        where = _where(field.group(1), given) if field else "a variable"
        raise UsageError(f"{where}: not valid JSON ({exc.__cause__ or exc})") from exc


def _check_port(host: str, port: int) -> None:
    """Bind ``host:port`` once and let go, so a port in use is refused before anything starts
    (uvicorn binds it again, with the same ``SO_REUSEADDR``)."""
    if port == 0:
        return
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


def preflight(settings: Settings) -> DataDirLock:
    """What ``rlreplay serve`` checks before it binds its port: the restore and backup
    settings, the data directory (locked here, for the life of the process) and the port.

    Returns:
        The data directory's lock, held.

    Raises:
        UsageError: A mistake in the settings, a data directory another process holds, a
            port in use; the message says which.
    """
    which = settings.restore.strip()
    if which != "none":
        if not settings.backup_url:
            raise UsageError(
                f"--restore {which} needs a backup URL (--backup-url or RLREPLAY_BACKUP_URL)"
            )
        if which != "latest":
            try:
                check_snapshot_id(which)
            except ValueError as exc:
                raise UsageError(f"--restore: {exc} (or 'latest', or 'none')") from exc
    if settings.backup_url:
        try:
            options = {**BackupStore.options_from_env(), **settings.backup_storage_options}
            BackupStore(settings.backup_url, storage_options=options)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
    lock = DataDirLock(settings.data_dir)
    try:
        lock.acquire()
    except DataDirInUse as exc:
        raise UsageError(str(exc)) from exc
    except OSError as exc:
        raise UsageError(f"data dir {str(settings.data_dir)!r} cannot be used: {exc}") from exc
    try:
        if settings.tcp:
            _check_port(settings.host, settings.port)
        _check_unix_socket(settings)
    except BaseException:
        lock.release()
        raise
    return lock


def _check_unix_socket(settings: Settings) -> None:
    """``--uds``: a path no live server holds; ``--no-tcp`` only with it."""
    from rlreplay.app.api.unix_socket import UnixSocketInUse, check_unix_socket

    if settings.uds is None:
        if not settings.tcp:
            raise UsageError("--no-tcp needs --uds PATH (or RLREPLAY_UDS): nothing to serve on")
        return
    try:
        check_unix_socket(settings.uds)
    except UnixSocketInUse as exc:
        raise UsageError(f"cannot listen on unix socket: {exc}") from exc


def _serve(settings: Settings) -> int:
    import uvicorn

    from rlreplay.app.api.connections import raise_descriptor_limit
    from rlreplay.app.api.logs import AccessLog, configure_logging
    from rlreplay.app.api.server import ReplayServer
    from rlreplay.app.engine.snapshots import RestoreRefused
    from rlreplay.app.main import create_app
    from rlreplay.app.storage.allocator import tune_allocator

    configure_logging(settings.log_level)
    raise_descriptor_limit(settings.max_connections)
    # glibc's malloc is the whole process's: the serving process tunes it here, and an
    # Engine created in another program (a test, a notebook) leaves it alone
    tune_allocator()
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
        access_log=AccessLog(sys.stderr),
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
    if settings.uds is None:
        server = ReplayServer(config, engine=app.state.engine)
        server.run()
    else:
        sockets, listener = _listen(config, settings)
        server = ReplayServer(config, engine=app.state.engine, listener=listener)
        try:
            server.run(sockets=sockets)
        finally:
            listener.remove()
    if failures:
        if isinstance(failures[0], RestoreRefused):  # --restore asked for what cannot be
            print(f"rlreplay serve: error: {failures[0]}", file=sys.stderr)
            return 2
        return 3  # uvicorn's status for a failed start-up
    return 0 if server.started else 1


def _listen(config: Any, settings: Settings) -> tuple[list[socket.socket], Any]:
    """The sockets to serve with ``--uds``: ``host:port`` unless ``--no-tcp``, and the Unix
    socket (its :class:`~rlreplay.app.api.unix_socket.UnixListener` returned too)."""
    import logging

    from rlreplay.app.api.unix_socket import UnixListener

    assert settings.uds is not None
    sockets = [config.bind_socket()] if settings.tcp else []  # logs the TCP address
    try:
        listener = UnixListener(settings.uds)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise UsageError(f"cannot listen on unix socket {str(settings.uds)!r}: {exc}") from exc
    logging.getLogger("uvicorn.error").info(
        "Uvicorn running on unix socket %s (Press CTRL+C to quit)", settings.uds
    )
    return [*sockets, listener.sock], listener


def _command_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-commands' parsers, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _unknown_flags(owner: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The ``--flags`` of ``argv`` that ``owner`` has no option for (nor one they abbreviate)."""
    flags = owner._option_string_actions
    unknown = []
    for arg in argv:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if arg.startswith("--") and not any(f.startswith(name) for f in flags):
            unknown.append(name)
    return unknown


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, but a mistyped command or flag is reported by the parser
    it belongs to (``serve``'s usage for a flag of ``serve``), with a "did you mean", before
    anything else is checked."""
    commands = _command_parsers(parser)
    if argv and not argv[0].startswith("-"):
        if argv[0] not in commands:
            parser.error(f"unknown command {argv[0]!r}{_did_you_mean(argv[0], list(commands))}")
        owner = commands[argv[0]]
        unknown = _unknown_flags(owner, argv[1:])
        if unknown:
            flags = list(owner._option_string_actions)
            hints = [h for h in (_did_you_mean(x, flags) for x in unknown) if h]
            owner.error(f"unrecognized arguments: {' '.join(unknown)}{hints[0] if hints else ''}")
    return parser.parse_args(argv)


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
    args = _parse(parser, argv)
    if args.command == "export":
        raise SystemExit(run_export(args))
    try:
        settings = _load_settings(args)
        lock = preflight(settings)
    except UsageError as exc:
        parser.exit(2, f"rlreplay serve: error: {exc}\n")
    try:
        status = _serve(settings)
    except UsageError as exc:
        parser.exit(2, f"rlreplay serve: error: {exc}\n")
    finally:
        lock.release()
    raise SystemExit(status)
