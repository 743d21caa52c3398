"""Browsable documentation served entirely by the server: no CDN, works offline.

Swagger UI (``/docs``) and ReDoc (``/redoc``) load their scripts and styles from
``/docs-static``, the assets shipped in the ``fastapi-offline`` package.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

__all__ = ["STATIC_URL", "install_docs"]

STATIC_URL = "/docs-static"
_ASSETS = Path(fastapi_offline.__file__).parent / "static"


def install_docs(app: FastAPI) -> None:
    """Adds ``/docs``, ``/redoc`` and their static assets to ``app``.

    Args:
        app: An app built with ``docs_url=None`` and ``redoc_url=None``.
    """
    app.mount(STATIC_URL, StaticFiles(directory=_ASSETS), name="docs-static")
    router = APIRouter(include_in_schema=False)
    title = app.title

    @router.get("/docs")
    async def swagger_ui(request: Request) -> HTMLResponse:
        """Swagger UI over ``/openapi.json``."""
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{root}{STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{STATIC_URL}/favicon.png",
            oauth2_redirect_url=None,
            swagger_ui_parameters={"validatorUrl": None, "tryItOutEnabled": True},
        )

    @router.get("/redoc")
    async def redoc(request: Request) -> HTMLResponse:
        """ReDoc over ``/openapi.json``."""
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{title} - ReDoc",
            redoc_js_url=f"{root}{STATIC_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{STATIC_URL}/favicon.png",
            with_google_fonts=False,
        )

    app.include_router(router)
