"""The request bodies of rollout tables: patches, claims, acknowledgements and versions,
decoded with the wire schemas and refused as :mod:`rlreplay.app.api.bodies` says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET

from rlreplay.app.api.bodies import check_keys, decode_struct, item_value_msgpack
from rlreplay.app.api.encoding import BodyFormat
from rlreplay.app.tables.tag_index import check_tags
from rlreplay.wire.errors import ValidationFailed
from rlreplay.wire.schemas import ClaimRequest, LeaseKeysRequest, PatchRequest, VersionRequest

__all__ = ["PatchBody", "parse_claim", "parse_lease_keys", "parse_patch", "parse_version"]

_FIELD_MAP = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])
#: The fields of a patch that sets tags alone.
_EMPTY_MAP = b"\x80"


@dataclass(frozen=True, slots=True)
class PatchBody:
    """A decoded patch: (key, msgpack map of the fields to set) per item."""

    items: list[tuple[str, bytes]]
    wait: bool
    request_id: str | None
    #: Per item, the tags the patch sets (None where it sets none); None: no item sets any.
    tags: list[dict[str, Any] | None] | None = None


def parse_patch(body: bytes, fmt: BodyFormat) -> PatchBody:
    """Parses ``{"items": [{"key", "fields"?, "tags"?}], "wait"?, "request_id"?}``; each
    ``fields`` must be a map of field names (JSON ones are converted to msgpack)."""
    request = decode_struct(body, fmt, PatchRequest)
    check_keys([it.key for it in request.items], lambda i: f"items[{i}].key")
    items = []
    tags: list[dict[str, Any] | None] = []
    for i, it in enumerate(request.items):
        tags.append(None if it.tags is UNSET else check_tags(it.tags, f"items[{i}].tags"))
        if it.fields is UNSET:
            if it.tags is UNSET:
                raise ValidationFailed(f"items[{i}] must set fields, tags or both")
            items.append((it.key, _EMPTY_MAP))
            continue
        raw = bytes(it.fields)
        if fmt is not BodyFormat.MSGPACK:
            raw = item_value_msgpack(raw, i)
        try:
            named = _FIELD_MAP.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError, RecursionError) as exc:
            raise ValidationFailed(f"items[{i}].fields must be a map of field names") from exc
        if not named and it.tags is UNSET:
            raise ValidationFailed(f"items[{i}].fields must name at least one field")
        items.append((it.key, raw))
    rid = None if request.request_id is UNSET else request.request_id
    return PatchBody(items, request.wait, rid, tags if any(t is not None for t in tags) else None)


def parse_claim(body: bytes, fmt: BodyFormat) -> ClaimRequest:
    """Parses a claim (``task``, ``batch_size``, ``fields``?, ``group_size``?...)."""
    return decode_struct(body, fmt, ClaimRequest)


def parse_lease_keys(body: bytes, fmt: BodyFormat | None) -> list[str] | None:
    """Parses ``{"keys"?: [...]}`` of an ack or release; None (all) when omitted."""
    if not body or fmt is None:
        return None
    request = decode_struct(body, fmt, LeaseKeysRequest)
    if request.keys is UNSET:
        return None
    check_keys(request.keys, lambda i: f"keys[{i}]")
    return request.keys


def parse_version(body: bytes, fmt: BodyFormat) -> VersionRequest:
    """Parses ``{"version": v, "force"?: bool}``."""
    return decode_struct(body, fmt, VersionRequest)
