#!/usr/bin/env python
"""The containers' health check, and what restarts one whose liveness probe keeps failing.

    rlreplay-healthcheck LIVE_URL [READY_URL] [--kill-after N] [--state FILE]

Exits 0 when ``LIVE_URL`` (``/healthz``) answers 200 and, if given, ``READY_URL``
(``/readyz``) does too; 1 otherwise. Docker reports that as the container's health, and
``depends_on: condition: service_healthy`` waits for it, but Docker alone (without Swarm)
restarts a container only when its process exits, never because it is unhealthy. So after
``--kill-after`` liveness failures in a row (no answer within the timeout, or an answer other
than 200, such as the 503 of a server whose writer died), the check ends the server itself:
with an init as PID 1 (compose's ``init: true``) it sends SIGKILL to every other process of
the container, which then exits and its ``restart:`` policy starts it again; with the server
as PID 1 it can only send it SIGTERM. A failing readiness probe (a restore in progress)
never kills. The count lives in ``--state`` (on /tmp, a tmpfs fresh at every start).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

INITS = frozenset({"docker-init", "tini", "dumb-init", "catatonit"})


def _answers_200(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _end_the_server() -> None:
    init = Path("/proc/1/comm").read_text().strip() if Path("/proc/1/comm").exists() else ""
    if init in INITS:
        # Every process this user may signal, but PID 1 and this one: the init then exits
        # with the server's status.
        os.kill(-1, signal.SIGKILL)
    else:
        os.kill(1, signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlreplay-healthcheck", description=__doc__)
    parser.add_argument("live_url")
    parser.add_argument("ready_url", nargs="?")
    parser.add_argument("--kill-after", type=int, default=3, help="0: never")
    parser.add_argument("--state", type=Path, default=Path("/tmp/rlreplay-liveness-failures"))
    parser.add_argument("--timeout-s", type=float, default=2.0)
    args = parser.parse_args(argv)

    # Counted before asking, so that a check Docker ends at its own timeout counts too.
    try:
        failures = int(args.state.read_text() or 0) + 1
    except (OSError, ValueError):
        failures = 1
    args.state.write_text(str(failures))
    if not _answers_200(args.live_url, args.timeout_s):
        print(f"{args.live_url}: not live ({failures} in a row)", file=sys.stderr)
        if 0 < args.kill_after <= failures:
            print("ending the server so that its restart policy starts it again", file=sys.stderr)
            _end_the_server()
        return 1
    args.state.write_text("0")
    if args.ready_url and not _answers_200(args.ready_url, args.timeout_s):
        print(f"{args.ready_url}: not ready", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
