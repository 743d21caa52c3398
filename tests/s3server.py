"""An S3 endpoint for tests: moto's server on 127.0.0.1, spoken to by s3fs and boto3 like AWS.

A real HTTP server (not moto's in-process mock) so the code under test goes through
s3fs/aiobotocore exactly as it does in production, and so a live ``rlreplay serve``
subprocess can reach the same endpoint.
"""

from __future__ import annotations

import logging
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
KEY = SECRET = "testing"


def start_moto() -> tuple[ThreadedMotoServer, str]:
    """A started moto server on a free port of 127.0.0.1, and its endpoint URL.

    The caller stops it with ``server.stop()``.
    """
    # werkzeug logs every request at INFO; a test's log should show the code under test.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def storage_options(endpoint_url: str) -> dict[str, Any]:
    """s3fs storage options that reach ``endpoint_url`` with moto's dummy credentials."""
    return {
        "key": KEY,
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": endpoint_url, "region_name": REGION},
    }


def create_bucket(endpoint_url: str, bucket: str) -> None:
    """Create ``bucket`` on the endpoint (s3fs's mkdir sends a region constraint moto refuses
    for us-east-1)."""
    client = boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
    )
    client.create_bucket(Bucket=bucket)
