"""``rlreplay sidecar``: the GPU sidecar's command line (the ``rlreplay`` command hands
``sidecar`` here, so that ``rlreplay serve`` never loads torch)."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

__all__ = ["build_sidecar_parser", "main"]


def build_sidecar_parser() -> argparse.ArgumentParser:
    """The parser of ``rlreplay sidecar``; each flag's default comes from
    ``RLREPLAY_SIDECAR_<FLAG>`` when set."""

    def env(name: str, default: str | None) -> str | None:
        return os.environ.get(f"RLREPLAY_SIDECAR_{name.upper()}", default)

    parser = argparse.ArgumentParser(
        prog="rlreplay sidecar",
        description=(
            "Follow one table of a replay server into device memory, select there, and serve "
            "batches as device-collected columns: POST /v1/sample, /healthz, /readyz, /metrics."
        ),
    )
    server, table = env("server", None), env("table", None)
    parser.add_argument("--server", metavar="URL", default=server, required=server is None)
    parser.add_argument("--table", metavar="NAME", default=table, required=table is None)
    parser.add_argument("--device", default=env("device", "cuda"), help="cuda, cuda:N or cpu")
    parser.add_argument("--host", default=env("host", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(env("port", "8001") or 8001))
    parser.add_argument("--api-key", default=env("api_key", None), help="the server's key")
    parser.add_argument("--seed", type=int, default=None, help="seed of the draws")
    parser.add_argument("--log-level", default=env("log_level", "info"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the sidecar until SIGINT or SIGTERM; the exit status."""
    args = build_sidecar_parser().parse_args(argv)
    import uvicorn

    from rlreplay.gpu.service import SidecarConfig, create_sidecar_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    # compose passes an unset key as an empty variable: no key, not an empty one
    config = SidecarConfig(args.server, args.table, args.device, args.api_key or None, args.seed)
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
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0
