"""Filesystem options for the backup URL from the environment.

Credentials and endpoints vary by backend (s3fs takes ``key``/``secret``/``client_kwargs``,
gcsfs ``token``...), so they travel as one JSON object rather than one setting per backend.
S3 also reads the usual ``AWS_*`` variables itself, through botocore.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["STORAGE_OPTIONS_ENV", "storage_options_from_env"]

STORAGE_OPTIONS_ENV = "RLREPLAY_BACKUP_STORAGE_OPTIONS"
"""Environment variable holding the filesystem's storage options as a JSON object."""


def storage_options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Storage options from ``RLREPLAY_BACKUP_STORAGE_OPTIONS``; ``{}`` when unset or empty.

    Args:
        environ: The environment to read; ``os.environ`` if ``None``.

    Raises:
        ValueError: The variable is not JSON, or not a JSON object; the message names it.
    """
    raw = (os.environ if environ is None else environ).get(STORAGE_OPTIONS_ENV, "")
    if not raw.strip():
        return {}
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{STORAGE_OPTIONS_ENV} is not valid JSON: {exc}") from exc
    if not isinstance(options, dict):
        kind = type(options).__name__
        raise ValueError(f"{STORAGE_OPTIONS_ENV} must be a JSON object, got {kind}")
    return options
