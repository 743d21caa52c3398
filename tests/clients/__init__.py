"""Tests of the client package: codec, client, retries, stream, live server."""
