"""The documentation: an OpenAPI schema that documents every route, served offline."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlparse

import httpx
import pytest

from tests.api.browser import CHROMIUM, Browser
from tests.live import LiveServer


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


async def test_every_summary_is_a_whole_phrase(client: httpx.AsyncClient) -> None:
    """A summary is its docstring's first line: a line break mid-sentence would cut it short
    (an unclosed parenthesis) and start the description in the middle of a sentence."""
    paths = (await client.get("/openapi.json")).json()["paths"]
    for path, ops in paths.items():
        for method, op in ops.items():
            summary, description = op["summary"], op.get("description") or ""
            assert summary.count("(") == summary.count(")"), (method, path, summary)
            assert summary.count("`") % 2 == 0, (method, path, summary)
            assert not description[:1].islower(), (method, path, description)


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


#: ReDoc's section of each operation.
SECTIONS = '[data-section-id^="operation/"]'
#: What Swagger UI and ReDoc show when they cannot read or resolve the document.
ERROR_TEXTS = (
    "Something went wrong",
    "Resolver error",
    "Invalid reference",
    "Could not resolve",
    "Failed to load API definition",
)


def _operations(live: LiveServer) -> dict[str, tuple[str, str]]:
    """Every operation of ``/openapi.json``: operationId → (METHOD, path)."""
    schema = httpx.get(f"{live.url}/openapi.json").json()
    return {
        op["operationId"]: (method.upper(), path)
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
    }


def _failed() -> str:
    """A JavaScript expression: the page shows one of :data:`ERROR_TEXTS`."""
    return " || ".join(f"document.body.innerText.includes({e!r})" for e in ERROR_TEXTS)


def _errors_in(text: str) -> list[str]:
    return [error for error in ERROR_TEXTS if error in text]


def test_swagger_ui_renders_every_operation_without_errors(live: LiveServer) -> None:
    assert CHROMIUM.exists(), "Debian chromium is needed: apt-get install -y chromium"
    operations = _operations(live)
    with Browser() as browser, browser.page() as page:
        page.goto(f"{live.url}/docs")
        page.wait_for(
            f"document.querySelectorAll('.opblock').length >= {len(operations)} || {_failed()}"
        )
        shown = page.evaluate(
            "[...document.querySelectorAll('.opblock')].map(op => ["
            "op.querySelector('.opblock-summary-method').textContent,"
            "op.querySelector('.opblock-summary-path').getAttribute('data-path')])"
        )
        assert sorted(map(tuple, shown)) == sorted(operations.values())
        # an operation's references are resolved when it is opened: open every one
        page.evaluate(
            "document.querySelectorAll('.opblock .opblock-summary-control')"
            ".forEach(button => button.click()); true"
        )
        page.wait_for(
            "document.querySelectorAll('.opblock.is-open .responses-wrapper,"
            f" .opblock.is-open .errors-wrapper').length >= {len(operations)}",
            timeout_s=300,
        )
        text = page.evaluate("document.body.innerText")
        assert not _errors_in(text), text[text.find(_errors_in(text)[0]) - 300 :][:1500]
        assert page.evaluate("document.querySelectorAll('.errors-wrapper').length") == 0


def test_redoc_renders_every_operation_without_errors(live: LiveServer) -> None:
    assert CHROMIUM.exists(), "Debian chromium is needed: apt-get install -y chromium"
    operations = _operations(live)
    with Browser() as browser, browser.page() as page:
        page.goto(f"{live.url}/redoc")
        page.wait_for(
            f"document.querySelectorAll({SECTIONS!r}).length >= {len(operations)} || {_failed()}"
        )
        text = page.evaluate("document.body.innerText")
        assert not _errors_in(text), text[:1500]
        sections = page.evaluate(
            f"[...document.querySelectorAll({SECTIONS!r})]"
            ".map(section => section.getAttribute('data-section-id'))"
        )
        assert sorted(sections) == sorted(f"operation/{op}" for op in operations)
