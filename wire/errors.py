"""The error tree shared by the service and its clients.

Every error the HTTP contract names is one class here, keyed by its ``code``::

    ReplayError                      (500 internal)
    ├── BadRequest                   400 bad_request
    ├── Unauthorized                 401 unauthorized
    ├── TableNotFound                404 table_not_found
    ├── ItemNotFound                 404 item_not_found
    ├── SnapshotNotFound             404 snapshot_not_found
    ├── LeaseNotFound                404 lease_not_found    (never issued, or expired)
    ├── NotFound                     404 not_found          (unknown route)
    ├── MethodNotAllowed             405 method_not_allowed
    ├── TableExists                  409 table_exists
    ├── VersionConflict              409 version_conflict   (a policy version going back)
    ├── NotConfigured                409 not_configured     (no --backup-url for snapshots)
    ├── StepConflict                 409 step_conflict      (an episode append at a wrong start)
    ├── Gone                         410 gone
    ├── PayloadTooLarge              413 payload_too_large
    ├── UnsupportedMediaType         415 unsupported_media_type
    ├── ValidationFailed             422 validation_error
    ├── StorageFull                  507 storage_full       (memory mode's hard cap)
    ├── Overloaded                   503 overloaded         (write queue full; retry later)
    ├── Unavailable                  503 unavailable        (writer stopped or failed, not ready)
    └── DeadlineExceeded             504 deadline_exceeded  (rate limiter timeout)

The server raises these; one handler turns them into the contract's body
``{"error": {"code": ..., "message": ...}}``. The client turns such a body back
into the same class with :func:`error_from_body`.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "BadRequest",
    "DeadlineExceeded",
    "Gone",
    "ItemNotFound",
    "LeaseNotFound",
    "MethodNotAllowed",
    "NotConfigured",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "ReplayError",
    "SnapshotNotFound",
    "StepConflict",
    "StorageFull",
    "TableExists",
    "TableNotFound",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "ValidationFailed",
    "VersionConflict",
    "error_from_body",
]


class ReplayError(Exception):
    """Base of every error of the service; ``code`` and ``status`` follow the contract."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.retry_after = retry_after

    def to_body(self) -> dict[str, Any]:
        """The contract's error body."""
        return {"error": {"code": self.code, "message": self.message}}


class BadRequest(ReplayError):
    """The body could not be decoded: malformed JSON or msgpack, wrong types."""

    code, status = "bad_request", 400


class Unauthorized(ReplayError):
    """API keys are configured and the request carries no valid bearer token."""

    code, status = "unauthorized", 401


class TableNotFound(ReplayError):
    """No table of that name."""

    code, status = "table_not_found", 404


class ItemNotFound(ReplayError):
    """No item with that key in the table."""

    code, status = "item_not_found", 404


class SnapshotNotFound(ReplayError):
    """No complete snapshot with that id at the backup URL."""

    code, status = "snapshot_not_found", 404


class LeaseNotFound(ReplayError):
    """No live lease with that id: the server never issued it, or it expired."""

    code, status = "lease_not_found", 404


class NotFound(ReplayError):
    """No route at that path."""

    code, status = "not_found", 404


class MethodNotAllowed(ReplayError):
    """The path exists but not with that method."""

    code, status = "method_not_allowed", 405


class TableExists(ReplayError):
    """A table of that name exists with a different configuration."""

    code, status = "table_exists", 409


class VersionConflict(ReplayError):
    """A table's policy version only moves forward: a lower one was asked for."""

    code, status = "version_conflict", 409


class NotConfigured(ReplayError):
    """The request needs a setting the server was started without (``--backup-url``)."""

    code, status = "not_configured", 409


class StepConflict(ReplayError):
    """An episode append whose ``start`` is not the episode's length (the message gives it),
    or an append to an ended episode."""

    code, status = "step_conflict", 409


class Gone(ReplayError):
    """The change feed no longer holds the sequence number asked for."""

    code, status = "gone", 410


class PayloadTooLarge(ReplayError):
    """The request body is over the configured limit."""

    code, status = "payload_too_large", 413


class UnsupportedMediaType(ReplayError):
    """The body is neither JSON nor msgpack."""

    code, status = "unsupported_media_type", 415


class ValidationFailed(ReplayError):
    """The body is well-formed but a value is invalid (batch_size 0, negative priority...)."""

    code, status = "validation_error", 422


class Overloaded(ReplayError):
    """The write queue is full; nothing was accepted, retry after ``retry_after`` seconds."""

    code, status = "overloaded", 503


class Unavailable(ReplayError):
    """The service cannot take the request now: not ready, shutting down, or its writer failed."""

    code, status = "unavailable", 503


class StorageFull(ReplayError):
    """Memory mode: the push would take the cache past its hard limit."""

    code, status = "storage_full", 507


class DeadlineExceeded(ReplayError):
    """A rate limiter kept the request waiting past its timeout."""

    code, status = "deadline_exceeded", 504


_BY_CODE: dict[str, type[ReplayError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        Unauthorized,
        TableNotFound,
        ItemNotFound,
        SnapshotNotFound,
        LeaseNotFound,
        NotFound,
        MethodNotAllowed,
        TableExists,
        VersionConflict,
        NotConfigured,
        StepConflict,
        Gone,
        PayloadTooLarge,
        UnsupportedMediaType,
        ValidationFailed,
        Overloaded,
        Unavailable,
        StorageFull,
        DeadlineExceeded,
    )
}


def error_from_body(status: int, body: Any, *, retry_after: float | None = None) -> ReplayError:
    """Rebuild the exception a server answered with, from its status and error body."""
    code, message = "internal", f"HTTP {status}"
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = str(body["error"].get("code", code))
        message = str(body["error"].get("message", message))
    cls = _BY_CODE.get(code, ReplayError)
    return cls(message, retry_after=retry_after)
