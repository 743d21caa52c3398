"""The backup store's error tree.

Every failure the store reports is one of these, so the server can tell "there is nothing to
restore" from "the backup is damaged" from "the backend cannot be reached"::

    BackupError                  anything the backup store refuses or cannot do
    ├── SnapshotNotFound         no such snapshot, or none usable for "latest"
    ├── SnapshotExists           a manifest with that id is already there (ids are create-only)
    ├── SnapshotCorrupt          a manifest or file does not match what was written
    ├── BackupUnavailable        the backend failed (OSError, botocore); ``__cause__`` has it
    └── TransferStopped          the caller asked a download to stop (the server is stopping)

Bad arguments (a URL with an unknown protocol, a non-positive ``keep``) raise ``ValueError``
naming the value, as constructors elsewhere in the service do.
"""

from __future__ import annotations

import importlib

__all__ = [
    "BACKEND_ERRORS",
    "BackupError",
    "BackupUnavailable",
    "SnapshotCorrupt",
    "SnapshotExists",
    "SnapshotNotFound",
    "TransferStopped",
]


class BackupError(Exception):
    """Base of every error the backup store raises."""


class SnapshotNotFound(BackupError):
    """The snapshot asked for has no manifest, or no snapshot is usable."""


class SnapshotExists(BackupError):
    """An upload named a snapshot id whose manifest is already written."""


class SnapshotCorrupt(BackupError):
    """A manifest cannot be read, or a file's size or checksum differs from its manifest."""


class BackupUnavailable(BackupError):
    """The backend failed: unreachable, refused credentials, out of space."""


class TransferStopped(BackupError):
    """The caller asked the transfer to stop (its ``stop`` event was set); what it had
    downloaded is removed."""


def _backend_errors() -> tuple[type[BaseException], ...]:
    """OSError, plus botocore's own roots when it is installed.

    s3fs turns most S3 failures into ``OSError``, but botocore raises some (no credentials,
    an endpoint that does not answer) as its own classes; the store must catch those without
    requiring botocore, which only the ``s3`` extra installs.
    """
    errors: list[type[BaseException]] = [OSError]
    try:
        botocore_errors = importlib.import_module("botocore.exceptions")
    except ImportError:
        return tuple(errors)
    errors += [botocore_errors.BotoCoreError, botocore_errors.ClientError]
    return tuple(errors)


BACKEND_ERRORS: tuple[type[BaseException], ...] = _backend_errors()
"""What a backend call may raise that means "the backend failed"."""
