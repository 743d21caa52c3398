"""``python -m rlreplay`` is the ``rlreplay`` command (``serve``, ``sidecar``)."""

from __future__ import annotations

from rlreplay.app.cli import main

if __name__ == "__main__":
    main()
