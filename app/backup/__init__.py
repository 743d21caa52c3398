"""Snapshots of the service's data kept under any fsspec URL (S3, GCS, HDFS, local, memory).

A :class:`BackupStore` uploads a snapshot folder incrementally (files are stored once by
content, ``files/<xxh3_128>/<name>``), writes its manifest last (``manifests/<id>.json``) so a
half-uploaded snapshot never exists, downloads and verifies a snapshot into a folder, restores
the newest one that verifies, and prunes old ones. The API is synchronous; the server calls it
from a worker thread.

Errors::

    BackupError                  anything the backup store refuses or cannot do
    ├── SnapshotNotFound         no such snapshot, or none usable for "latest"
    ├── SnapshotExists           a manifest with that id is already there
    ├── SnapshotCorrupt          a manifest or file does not match what was written
    ├── BackupUnavailable        the backend failed (OSError, botocore); ``__cause__`` has it
    └── TransferStopped          the caller asked a download to stop
"""

from rlreplay.app.backup.errors import (
    BackupError,
    BackupUnavailable,
    SnapshotCorrupt,
    SnapshotExists,
    SnapshotNotFound,
    TransferStopped,
)
from rlreplay.app.backup.manifest import Manifest, SnapshotFile
from rlreplay.app.backup.options import STORAGE_OPTIONS_ENV
from rlreplay.app.backup.progress import ProgressInfo
from rlreplay.app.backup.store import LATEST, BackupStore
from rlreplay.app.backup.upload import UploadResult

__all__ = [
    "LATEST",
    "STORAGE_OPTIONS_ENV",
    "BackupError",
    "BackupStore",
    "BackupUnavailable",
    "Manifest",
    "ProgressInfo",
    "SnapshotCorrupt",
    "SnapshotExists",
    "SnapshotFile",
    "SnapshotNotFound",
    "TransferStopped",
    "UploadResult",
]
