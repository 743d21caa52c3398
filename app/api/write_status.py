"""The HTTP status of a write's answer: the engine answers what happened
(:class:`~rlreplay.app.writer.request_ids.AnswerKind`), the API says it with a status.

A write (push, patch, deletes) answers ``{"committed": n}`` once the writer applied it
(``wait: true``) and ``{"accepted": n}`` once it is accepted; a repeat of its request id
gets the first answer, and so the first status.
"""

from __future__ import annotations

from typing import Any

from rlreplay.app.writer.request_ids import AnswerKind, answer_kind

__all__ = ["STATUS_OF_KIND", "status_of"]

#: The status each kind of answer is sent with.
STATUS_OF_KIND: dict[AnswerKind, int] = {AnswerKind.COMMITTED: 200, AnswerKind.ACCEPTED: 202}


def status_of(answer: dict[str, Any]) -> int:
    """200 for an answer that says ``committed``, 202 for one that says ``accepted``."""
    return STATUS_OF_KIND[answer_kind(answer)]
