"""The OpenAPI schema: documented bodies, answers and errors of routes that parse bodies themselves.

Routes declare their request body with :func:`request_body` (``openapi_extra``) and their
answers with :func:`answers`, naming the Structs of :mod:`rlreplay.wire.schemas` (the table
config, the pydantic :class:`~rlreplay.app.tables.config.TableConfig`). A body or answer of
two forms names both; the document gets a component that is ``oneOf`` them
(``PushRequestOrColumnsPushRequest``). FastAPI collects
only the models it validates itself, so :func:`build_openapi` adds the schemas of these to
the document's components: msgspec generates them from the same Structs the server decodes
with. Every Struct a route names is registered as it is named, so the document defines
each schema it refers to; :func:`dangling_refs` finds any ``$ref`` that would not resolve,
and :func:`build_openapi` refuses to serve such a document.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from typing import Any

import msgspec
from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic.json_schema import models_json_schema

from rlreplay.app.tables.config import TableConfig
from rlreplay.wire import schemas
from rlreplay.wire.errors import (
    BadRequest,
    PayloadTooLarge,
    ReplayError,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    ValidationFailed,
)

__all__ = [
    "BODY_ERRORS",
    "V1_ERRORS",
    "answers",
    "build_openapi",
    "dangling_refs",
    "request_body",
    "summaries_from_docstrings",
]

_REF = "#/components/schemas/{name}"  # msgspec's placeholder; pydantic's is {model}
_BODY_TYPES = ("application/json", "application/msgpack", "application/x-msgpack")
_ANSWER_TYPES = ("application/json", "application/msgpack")

#: The wire schemas the document names: request bodies and answers (the Structs they
#: contain are collected with them).
_STRUCTS: tuple[type[msgspec.Struct], ...] = (
    schemas.PushRequest,
    schemas.ColumnsPushRequest,
    schemas.KeysRequest,
    schemas.DeleteRequest,
    schemas.SampleRequest,
    schemas.PrioritiesRequest,
    schemas.ErrorBody,
    schemas.Accepted,
    schemas.PushCommitted,
    schemas.ItemOut,
    schemas.ItemList,
    schemas.SampleResponse,
    schemas.SampleColumns,
    schemas.ItemColumns,
    schemas.PrioritiesUpdated,
    schemas.TableInfo,
    schemas.TableList,
    schemas.Health,
    schemas.PatchRequest,
    schemas.PatchAnswer,
    schemas.ClaimRequest,
    schemas.ClaimAnswer,
    schemas.LeaseKeysRequest,
    schemas.Acked,
    schemas.Released,
    schemas.VersionRequest,
    schemas.VersionAnswer,
    schemas.TasksAnswer,
)

#: Errors every ``/v1`` route may answer.
V1_ERRORS: tuple[type[ReplayError], ...] = (
    Unauthorized,
    ValidationFailed,
    Unavailable,
    ReplayError,
)
#: Errors of every route that reads a body.
BODY_ERRORS: tuple[type[ReplayError], ...] = (
    BadRequest,
    PayloadTooLarge,
    UnsupportedMediaType,
    ValidationFailed,
)


#: The components that are ``oneOf`` several Structs, by name (see :func:`_one_of`).
_ONE_OF: dict[str, tuple[type[msgspec.Struct], ...]] = {}
#: Those of them whose forms overlap (a body both forms take, the table's kind deciding
#: which applies): ``anyOf``.
_ANY_OF: set[str] = set()
#: The Structs routes name in their bodies and answers, by name (see :func:`_ref`).
_NAMED: dict[str, type[msgspec.Struct]] = {}

#: A Struct, or the Structs of a body or answer that takes any of several forms.
Forms = type[Any] | tuple[type[msgspec.Struct], ...]


def _ref(schema: Forms) -> dict[str, str]:
    """A reference to ``schema``'s component, registered for the document."""
    if isinstance(schema, tuple):
        return {"$ref": _REF.format(name=_one_of(schema))}
    if isinstance(schema, type) and issubclass(schema, msgspec.Struct):
        _NAMED[schema.__name__] = schema
    return {"$ref": _REF.format(name=schema.__name__)}


def _one_of(structs: tuple[type[msgspec.Struct], ...]) -> str:
    """The name of the component that is ``oneOf`` ``structs`` (registered for the document)."""
    name = "Or".join(struct.__name__ for struct in structs)
    _ONE_OF[name] = structs
    for struct in structs:
        _NAMED[struct.__name__] = struct
    return name


def request_body(
    schema: type[Any],
    *alternatives: type[msgspec.Struct],
    example: Any = None,
    required: bool = True,
    overlapping: bool = False,
) -> dict[str, Any]:
    """``openapi_extra`` documenting a JSON or msgpack body shaped like ``schema``.

    Args:
        schema: A request Struct of :mod:`rlreplay.wire.schemas`, or ``TableConfig``.
        *alternatives: Other forms the body may take (the document's schema is ``oneOf``
            them all, their examples listed in it).
        example: An example body; by default the Struct's ``EXAMPLE``.
        required: Whether the body may be left out.
        overlapping: The forms overlap (``{"batch_size": 8}`` samples an item table and an
            episode table alike): the schema is ``anyOf`` them.

    Returns:
        The ``openapi_extra`` mapping of the route.
    """
    if example is None:
        example = schema.EXAMPLE
    forms: Forms = (schema, *alternatives) if alternatives else schema
    if overlapping and alternatives:
        _ANY_OF.add(_one_of((schema, *alternatives)))
    content = {media: {"schema": _ref(forms)} for media in _BODY_TYPES}
    content["application/json"]["example"] = example
    return {"requestBody": {"required": required, "content": content}}


def _content(schema: Forms) -> dict[str, Any]:
    return {media: {"schema": _ref(schema)} for media in _ANSWER_TYPES}


def answers(
    ok: dict[int, tuple[Forms | None, str]],
    *errors: type[ReplayError],
) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route: its successful answers and its error answers.

    Args:
        ok: Status -> (the Struct of the body, a tuple of Structs when it takes one of
            several forms, or None for no body; description).
        *errors: The error classes the route may answer with; those sharing a status are
            documented together, with every code listed.

    Returns:
        The mapping for the route decorator's ``responses``.
    """
    out: dict[int | str, dict[str, Any]] = {}
    for status, (schema, description) in ok.items():
        entry: dict[str, Any] = {"description": description}
        if schema is not None:
            entry["content"] = _content(schema)
        out[status] = entry
    by_status: dict[int, list[type[ReplayError]]] = defaultdict(list)
    for cls in errors:
        if cls not in by_status[cls.status]:
            by_status[cls.status].append(cls)
    for status, classes in sorted(by_status.items()):
        meanings = " ".join(f"`{c.code}`: {(c.__doc__ or '').strip()}" for c in classes)
        entry = {"description": meanings, "content": _content(schemas.ErrorBody)}
        if status == 503:
            entry["headers"] = {
                "Retry-After": {
                    "description": "Seconds to wait before retrying.",
                    "schema": {"type": "integer"},
                }
            }
        out[status] = entry
    return out


def summaries_from_docstrings(router: APIRouter) -> APIRouter:
    """Sets each route's summary to its docstring's first line, its description to the rest.

    Args:
        router: The router, before it is included in the app.

    Returns:
        The same router.
    """
    for route in router.routes:
        if isinstance(route, APIRoute) and route.summary is None:
            doc = inspect.getdoc(route.endpoint) or ""
            first, _, rest = doc.partition("\n")
            route.summary = first.strip().rstrip(".") or None
            route.description = rest.strip() or first.strip()
    return router


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI schema, built once, with the wire schemas in its components."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
        tags=app.openapi_tags,
        separate_input_output_schemas=app.separate_input_output_schemas,
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(_struct_components())
    _, defs = models_json_schema(
        [(TableConfig, "validation")], ref_template=_REF.replace("{name}", "{model}")
    )
    for name, definition in defs.get("$defs", {}).items():
        components.setdefault(name, definition)
    dangling = dangling_refs(schema)
    if dangling:
        raise RuntimeError(f"the OpenAPI document refers to undefined schemas: {dangling}")
    app.openapi_schema = schema
    return schema


def dangling_refs(document: dict[str, Any]) -> list[str]:
    """The local ``$ref`` pointers of ``document`` (a JSON document) that resolve to nothing,
    each once, in the order met."""
    found: dict[str, None] = {}

    def resolves(pointer: str) -> bool:
        node: Any = document
        for token in pointer.removeprefix("#/").split("/") if pointer != "#" else []:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return False
        return True

    stack: list[Any] = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and (not ref.startswith("#") or not resolves(ref)):
                found.setdefault(ref)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return list(found)


def _struct_components() -> dict[str, Any]:
    """The JSON Schemas of the wire Structs, by name, linked to each other by ``$ref``."""
    structs = tuple({**{s.__name__: s for s in _STRUCTS}, **_NAMED}.values())
    _, components = msgspec.json.schema_components(structs, ref_template=_REF)
    for struct in structs:
        example = getattr(struct, "EXAMPLE", None)  # request bodies have one
        if example is not None:
            components[struct.__name__]["examples"] = [example]
    for name, structs in _ONE_OF.items():
        examples = [getattr(s, "EXAMPLE", None) for s in structs]
        components[name] = {
            "anyOf" if name in _ANY_OF else "oneOf": [_ref(struct) for struct in structs],
            **({"examples": examples} if None not in examples else {}),
        }
    # wire cannot name the server's pydantic TableConfig: the document links it here
    config = components["TableInfo"]["properties"]["config"]
    components["TableInfo"]["properties"]["config"] = {
        "description": config["description"],
        **_ref(TableConfig),
    }
    return components
