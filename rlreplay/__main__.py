"""``python -m rlreplay`` is the ``rlreplay`` command (``serve``, ``sidecar``, ``export``)."""

from __future__ import annotations

from rlreplay.command import main

if __name__ == "__main__":
    main()
