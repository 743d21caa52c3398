"""The OpenAPI schema: documented bodies, answers and errors of routes that parse bodies themselves.

Routes declare their request body with :func:`request_body` (``openapi_extra``) and their
answers with :func:`answers`; :func:`build_openapi` adds the request models to the schema's
components, since FastAPI only collects the models it validates itself.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from rlreplay.app.api.schemas import REQUEST_MODELS, ErrorBody
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
    "request_body",
    "summaries_from_docstrings",
]

_REF = "#/components/schemas/{model}"
_BODY_TYPES = ("application/json", "application/msgpack", "application/x-msgpack")

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


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def request_body(model: type[BaseModel], *, example: Any, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` documenting a JSON or msgpack body shaped like ``model``.

    Args:
        model: The documenting model (one of :data:`rlreplay.app.api.schemas.REQUEST_MODELS`).
        example: An example body.
        required: Whether the body may be left out.

    Returns:
        The ``openapi_extra`` mapping of the route.
    """
    content = {media: {"schema": _ref(model)} for media in _BODY_TYPES}
    content["application/json"]["example"] = example
    return {"requestBody": {"required": required, "content": content}}


def answers(
    ok: dict[int, tuple[type[BaseModel] | None, str]],
    *errors: type[ReplayError],
) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route: its successful answers and its error answers.

    Args:
        ok: Status -> (model of the body or None for no body, description).
        *errors: The error classes the route may answer with; those sharing a status are
            documented together, with every code listed.

    Returns:
        The mapping for the route decorator's ``responses``.
    """
    out: dict[int | str, dict[str, Any]] = {}
    for status, (model, description) in ok.items():
        entry: dict[str, Any] = {"description": description}
        if model is not None:
            entry["model"] = model
            entry["content"] = {"application/msgpack": {"schema": _ref(model)}}
        out[status] = entry
    by_status: dict[int, list[type[ReplayError]]] = defaultdict(list)
    for cls in errors:
        if cls not in by_status[cls.status]:
            by_status[cls.status].append(cls)
    for status, classes in sorted(by_status.items()):
        meanings = " ".join(f"`{c.code}`: {(c.__doc__ or '').strip()}" for c in classes)
        entry = {
            "model": ErrorBody,
            "description": meanings,
            "content": {"application/msgpack": {"schema": _ref(ErrorBody)}},
        }
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
    """The app's OpenAPI schema, built once, with the request models in its components."""
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
    _, defs = models_json_schema(
        [(model, "validation") for model in REQUEST_MODELS], ref_template=_REF
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in defs.get("$defs", {}).items():
        components.setdefault(name, definition)
    app.openapi_schema = schema
    return schema
