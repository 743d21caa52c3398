"""Backends for the backup tests: a local folder, fsspec's memory filesystem, and S3 through
s3fs against a moto server started once per session."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pytest

from tests.s3server import create_bucket, start_moto, storage_options

BUCKET = "rlreplay-backups"


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """The endpoint URL of a moto S3 server with the bucket ``rlreplay-backups``."""
    server, endpoint_url = start_moto()
    try:
        create_bucket(endpoint_url, BUCKET)
        yield endpoint_url
    finally:
        server.stop()


@dataclass
class Backend:
    """A fresh, empty backup URL and the options that open it."""

    url: str
    options: dict[str, Any] = field(default_factory=dict)

    def fs(self) -> tuple[fsspec.AbstractFileSystem, str]:
        """The filesystem and root path behind the URL, to inspect or damage objects."""
        fs, root = fsspec.core.url_to_fs(self.url, **self.options)
        return fs, root.rstrip("/")


@pytest.fixture(params=["file", "memory", "s3"])
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backend]:
    """An empty backup URL on each backend in turn (a local one outside the test's tmp_path,
    so tests can see that a download leaves nothing behind there)."""
    unique = uuid.uuid4().hex
    if request.param == "file":
        yield Backend(f"file://{tmp_path_factory.mktemp('backups')}")
    elif request.param == "memory":
        backend = Backend(f"memory://rlreplay-test-{unique}")
        yield backend
        fs, root = backend.fs()
        if fs.exists(root):
            fs.rm(root, recursive=True)
    else:
        endpoint_url = request.getfixturevalue("moto_endpoint")
        yield Backend(f"s3://{BUCKET}/{unique}", storage_options(endpoint_url))
