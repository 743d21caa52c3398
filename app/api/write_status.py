"""The HTTP status of a write's answer: the engine answers what happened, the API says it
with a status.

A write (push, patch, deletes) answers ``{"committed": n}`` once the writer applied it
(``wait: true``) and ``{"accepted": n}`` once it is accepted; a repeat of its request id
gets the first answer, and so the first status.
"""

from __future__ import annotations

from typing import Any

__all__ = ["status_of"]


def status_of(answer: dict[str, Any]) -> int:
    """200 for an answer that says ``committed``, 202 for one that says ``accepted``."""
    return 200 if "committed" in answer else 202
