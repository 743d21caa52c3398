"""``python -m rlreplay.app`` is ``rlreplay serve`` (with the same flags)."""

from __future__ import annotations

import sys

from rlreplay.app.cli import main

if __name__ == "__main__":
    main(["serve", *sys.argv[1:]])
