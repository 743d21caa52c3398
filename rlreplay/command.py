"""The ``rlreplay`` console script: ``sidecar`` goes to the GPU sidecar
(:mod:`rlreplay.gpu.cli`), everything else to the service's command line
(:mod:`rlreplay.app.cli`), so that ``rlreplay serve`` never loads torch."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``rlreplay``.

    Args:
        argv: The arguments (``sys.argv[1:]`` when None).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["sidecar"]:
        try:
            from rlreplay.gpu.cli import main as sidecar_main
        except ImportError as exc:  # torch and the rest of the gpu extra
            # without torch, the message already names the extra (rlreplay.gpu.TorchMissing)
            hint = "" if "rlreplay[gpu]" in str(exc) else " (pip install -e '.[gpu]' in a clone)"
            print(f"rlreplay sidecar: error: {exc}{hint}", file=sys.stderr)
            raise SystemExit(2) from exc
        raise SystemExit(sidecar_main(args[1:]))
    try:
        from rlreplay.app.cli import main as service_main
    except ModuleNotFoundError as exc:  # the service's packages are the server extra's
        if (exc.name or "rlreplay").startswith("rlreplay"):
            raise
        command = f"rlreplay {args[0]}" if args[:1] and args[0][0] != "-" else "rlreplay"
        print(
            f"{command}: error: {exc}: the service needs the server extra "
            "(pip install -e '.[server]' in a clone of rlreplay)",
            file=sys.stderr,
        )
        raise SystemExit(2) from exc
    service_main(args)
