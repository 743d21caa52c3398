"""Every ``$ref`` of ``/openapi.json`` resolves: documentation tools (Swagger UI, ReDoc,
client generators) fail on the first one that does not."""

from __future__ import annotations

from typing import Any

import httpx

from rlreplay.app.api.openapi import dangling_refs


def _resolve(document: dict[str, Any], ref: str) -> Any:
    """The node a local JSON pointer (RFC 6901) names; KeyError when there is none."""
    assert ref.startswith("#/"), f"not a local reference: {ref}"
    node: Any = document
    for token in ref[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


async def test_every_ref_of_the_openapi_document_resolves(client: httpx.AsyncClient) -> None:
    answer = await client.get("/openapi.json")
    assert answer.status_code == 200
    document = answer.json()
    refs = set(_refs(document))
    assert len(refs) > 40
    missing = []
    for ref in sorted(refs):
        try:
            target = _resolve(document, ref)
        except (KeyError, IndexError, ValueError):
            missing.append(ref)
            continue
        assert isinstance(target, dict), ref
    assert missing == []
    schemas = document["components"]["schemas"]
    for name in ("ChangeList", "Snapshot", "SnapshotList", "SnapshotRequest", "TableIndex"):
        assert "properties" in schemas[name], name


def test_dangling_refs_names_what_does_not_resolve() -> None:
    document = {
        "a": {"$ref": "#/components/schemas/Here"},
        "b": [{"$ref": "#/components/schemas/Gone"}, {"$ref": "#/a"}],
        "c": {"$ref": "#/components/schemas/Gone"},
        "d": {"$ref": "#/paths/~1v1~1tables/get"},
        "paths": {"/v1/tables": {"get": {}}},
        "components": {"schemas": {"Here": {}}},
    }
    assert dangling_refs(document) == ["#/components/schemas/Gone"]
