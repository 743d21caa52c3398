"""rlreplay: an experience replay service for reinforcement learning, over HTTP."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["package_version"]


def package_version() -> str:
    """The installed distribution's version (``0.0.0`` from a bare checkout)."""
    try:
        return version("rlreplay")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0.0.0"
