"""The client bench's codec rows run against today's bodies (a push body may be pieces)."""

from __future__ import annotations

from bench.client import codec_rows


def test_the_codec_rows_decode_what_the_client_encodes() -> None:
    rows = codec_rows(0.01)
    assert len(rows) == 5
    for name, encode_us, decode_us, size in rows:
        assert isinstance(encode_us, float) and encode_us > 0, name
        assert decode_us == "" or (isinstance(decode_us, float) and decode_us > 0), name
        assert isinstance(size, int) and size > 0, name
