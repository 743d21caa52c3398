"""The documentation: an OpenAPI schema that documents every route, served offline."""

from __future__ import annotations

import re
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

import httpx
import pytest

from tests.live import LiveServer

CHROMIUM = Path("/usr/bin/chromium")


async def test_openapi_documents_every_route(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    paths = schema["paths"]
    expected = {
        ("put", "/v1/tables/{table}"),
        ("get", "/v1/tables"),
        ("get", "/v1/tables/{table}"),
        ("delete", "/v1/tables/{table}"),
        ("post", "/v1/tables/{table}/items"),
        ("get", "/v1/tables/{table}/items/{key}"),
        ("delete", "/v1/tables/{table}/items/{key}"),
        ("post", "/v1/tables/{table}/items:batchGet"),
        ("post", "/v1/tables/{table}/items:batchDelete"),
        ("post", "/v1/tables/{table}/sample"),
        ("post", "/v1/tables/{table}/priorities"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
    }
    found = {(m, p) for p, ops in paths.items() for m in ops}
    assert expected <= found
    components = schema["components"]["schemas"]
    for method, path in expected:
        op = paths[path][method]
        assert op["summary"] and not op["summary"].endswith("."), (method, path)
        assert any(s.startswith("2") for s in op["responses"]), (method, path)
        if path.startswith("/v1"):
            assert "401" in op["responses"] and "422" in op["responses"], (method, path)
            err = op["responses"]["401"]["content"]["application/json"]["schema"]
            assert err == {"$ref": "#/components/schemas/ErrorBody"}
        if method in ("post", "put"):
            body = op["requestBody"]["content"]
            assert {"application/json", "application/msgpack"} <= set(body)
            ref = body["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
            assert ref in components
            assert "example" in body["application/json"]
            assert {"400", "413", "415"} <= set(op["responses"]), (method, path)
    push = paths["/v1/tables/{table}/items"]["post"]
    assert push["summary"] == "Push items (an existing key is replaced)"
    assert "503" in push["responses"] and "Retry-After" in push["responses"]["503"]["headers"]
    assert "504" in paths["/v1/tables/{table}/sample"]["post"]["responses"]
    assert "409" in paths["/v1/tables/{table}"]["put"]["responses"]


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_assets_are_all_served_locally(live: LiveServer, page: str) -> None:
    html = httpx.get(live.url + page).text
    assert not re.search(r"https?://(?!127\.0\.0\.1)", html), "an external URL in the page"
    parser = _Links()
    parser.feed(html)
    assert len(parser.urls) >= 2
    for url in parser.urls:
        absolute = urljoin(live.url + page, url)
        assert urlparse(absolute).netloc == urlparse(live.url).netloc, url
        r = httpx.get(absolute)
        assert r.status_code == 200 and len(r.content) > 100, url
    assert re.search(r"(spec-url=|url: ?)['\"]/openapi.json", html)


def test_swagger_ui_renders_the_operations_in_a_headless_browser(live: LiveServer) -> None:
    assert CHROMIUM.exists(), "Debian chromium is needed: apt-get install -y chromium"
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-dev-shm-usage",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=5000",
                "--dump-dom",
                f"{live.url}/docs",
            ],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        ).stdout
    assert "opblock" in dom, dom[:2000]
    for path in ("/v1/tables/{table}/items", "/v1/tables/{table}/sample", "/healthz"):
        assert f'data-path="{path}"' in dom, path
    assert dom.count("opblock-summary-path") >= 14
