"""Sending the contract's requests: the connection pool, retries and the codec at both ends.

:class:`Requester` is the part of :class:`~rlreplay.clients.client.ReplayClient` that turns
one call into HTTP: it encodes the body (:func:`rlreplay.clients.bodies.encode_body`), sends
it through the pool with the retry policy of :mod:`rlreplay.clients.retry`, and decodes the
answer or raises the error it carries (:mod:`rlreplay.wire.errors`).
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import quote

import httpx

from rlreplay.clients.bodies import encode_body
from rlreplay.clients.columns import decode_views
from rlreplay.clients.event_loop import bound_loop
from rlreplay.clients.http11 import new_request
from rlreplay.clients.retry import RetryPolicy, parse_retry_after
from rlreplay.clients.server_url import server_address
from rlreplay.clients.transport import LeanTransport
from rlreplay.wire.codec import from_jsonable, unpackb
from rlreplay.wire.compression import MIN_BYTES, ZSTD, compress
from rlreplay.wire.errors import Overloaded, ReplayError, Unavailable, error_from_body
from rlreplay.wire.pieces import Pieces

__all__ = ["MSGPACK", "Requester", "answer_map", "path_segment", "table_path"]

MSGPACK: Final = "application/msgpack"
_USER_AGENT: Final = "rlreplay-client/0.1"
_KEEPALIVE_EXPIRY_S: Final = 30.0
_URL_CACHE_SIZE: Final = 256

# Tells LeanTransport that the request may be sent again on a fresh connection when a pooled
# one turns out to have been closed by the server (see clients.transport).
_IDEMPOTENT: Final = {"idempotent": True}

# Failures where the request provably never reached the server.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def path_segment(value: str, what: str) -> str:
    """One percent-encoded path segment; ``/``, ``:``, ``?``, ``%`` and dot-segments included."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, not {value!r}")
    if value in {".", ".."}:
        return value.replace(".", "%2E")
    return quote(value, safe="")


def table_path(name: str, rest: str = "") -> str:
    """The path of table ``name``, and ``rest`` after it."""
    return "/v1/tables/" + path_segment(name, "table name") + rest


def answer_map(answer: Any) -> dict[str, Any]:
    """``answer`` when it is a map, else :class:`ReplayError`."""
    if not isinstance(answer, dict):
        raise ReplayError(f"expected a map in the answer, got {type(answer).__name__}")
    return answer


class Requester:
    """The connection pool of one server and the sending of requests to it.

    :class:`~rlreplay.clients.client.ReplayClient` holds one and hands it to each of its
    parts (tables, items, samples, rollouts, episodes), which send their calls through
    :meth:`call`. The arguments are ``ReplayClient``'s.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        *,
        timeout_s: float = 30.0,
        max_connections: int = 16,
        retries: int = 3,
        backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
        lean_transport: bool = True,
        compression: str | None = None,
    ) -> None:
        if compression not in (None, ZSTD):
            raise ValueError(f"compression ({compression!r}) must be None or {ZSTD!r}")
        if not isinstance(base_url, str):
            raise TypeError(
                "ReplayClient takes one server URL; spread tables over several servers "
                "with ShardedReplayClient([url, ...])"
            )
        if timeout_s <= 0:
            raise ValueError(f"timeout_s ({timeout_s}) must be > 0")
        if max_connections < 1:
            raise ValueError(f"max_connections ({max_connections}) must be >= 1")
        self._policy = RetryPolicy(
            retries=retries, backoff_s=backoff_s, max_backoff_s=max_backoff_s
        )
        self._timeout_s = timeout_s
        base_url, uds = server_address(base_url)
        # Our own LeanTransport is called directly (see _exchange), skipping the per-request work
        # of httpx.AsyncClient (auth and redirect flows, cookies, hooks) that we never use.
        self._lean: LeanTransport | None = None
        if transport is None and lean_transport and httpx.URL(base_url).scheme == "http":
            transport = self._lean = LeanTransport(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=_KEEPALIVE_EXPIRY_S,
                uds=uds,
            )
        elif transport is None and uds is not None:
            transport = httpx.AsyncHTTPTransport(
                uds=uds,
                limits=httpx.Limits(
                    max_connections=max_connections,
                    max_keepalive_connections=max_connections,
                    keepalive_expiry=_KEEPALIVE_EXPIRY_S,
                ),
            )
        # Calls beyond max_connections wait here, in O(1), rather than in httpcore's pool
        # queue, whose bookkeeping costs O(connections x queued requests) per event.
        self._slots = asyncio.Semaphore(max_connections)
        headers = {"Accept": MSGPACK, "User-Agent": _USER_AGENT}
        self._zstd = compression == ZSTD
        # httpx would ask for every coding it can decode (zstd too, with zstandard installed)
        headers["Accept-Encoding"] = ZSTD if self._zstd else "identity"
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = httpx.Timeout(timeout_s)
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            timeout=self._timeout,
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=_KEEPALIVE_EXPIRY_S,
            ),
            http1=True,
            http2=False,
            transport=transport,
        )

        # Absolute URLs of the paths called, so that httpx does not parse and merge the base
        # URL on every request; cleared when full (item paths vary by key).
        self._urls: dict[str, httpx.URL] = {}
        # The event loop the client first ran on: its connections belong to it.
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool; calling it again does nothing."""
        await self._http.aclose()

    @property
    def timeout_s(self) -> float:
        """The timeout of one attempt; calls that wait on the server stretch their read
        timeout past it."""
        return self._timeout_s

    def receive_buffers(self, count: int) -> AbstractContextManager[None]:
        """Keep up to ``count`` buffers for long answers while the block runs (a stream
        with answers in flight); a no-op without the client's own transport."""
        return self._lean.receive_buffers(count) if self._lean is not None else nullcontext()

    async def health(self) -> bool:
        """Whether the server answers ``GET /healthz`` with 2xx (one attempt, no retries).

        Raises:
            WrongEventLoop: Called from another event loop than the client's first call.
        """
        self.check_loop()
        try:
            response = await self._http.get("/healthz")
        except httpx.HTTPError:
            return False
        return response.is_success

    def _url(self, path: str) -> httpx.URL:
        """``path`` under the base URL, as httpx would merge it (cached)."""
        url = self._urls.get(path)
        if url is None:
            if len(self._urls) >= _URL_CACHE_SIZE:
                self._urls.clear()
            base = self._http.base_url
            raw_path = base.raw_path + path.lstrip("/").encode("ascii")
            url = self._urls[path] = base.copy_with(raw_path=raw_path)
        return url

    def check_loop(self) -> None:
        """Raise :class:`WrongEventLoop` unless called from the loop of the first call."""
        if asyncio.get_running_loop() is not self._loop:
            self._loop = bound_loop(self._loop, "ReplayClient")

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        idempotent: bool,
        read_timeout_s: float | None = None,
        raw: bool = False,
        views: bool = False,
    ) -> Any:
        """Send one request with retries; return the decoded answer (None for no content),
        or with ``raw`` the answer's bytes as they came (msgpack); with ``views`` its arrays
        are views of the buffer the answer was read into (a columnar batch's, see
        :func:`~rlreplay.clients.columns.decode_views`).

        Raises:
            WrongEventLoop: Called from another event loop than the first call (nothing sent).
        """
        self.check_loop()
        content = None if body is None else encode_body(body)
        coded = self._zstd and content is not None and len(content) >= MIN_BYTES
        if coded:
            content = compress([content])
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                async with self._slots:
                    response, answer = await self._exchange(
                        method,
                        path,
                        content,
                        idempotent=idempotent,
                        read_s=read_timeout_s,
                        coded=coded,
                    )
            except (httpx.UnsupportedProtocol, httpx.LocalProtocolError):
                raise  # a bad URL or request: retrying cannot help
            except _NOT_SENT as exc:
                failure: ReplayError | httpx.HTTPError = exc
            except httpx.TransportError as exc:
                failure = exc
                if not idempotent:
                    raise Unavailable(f"{method} {path} failed: {exc!r}") from exc
            else:
                if response.is_success:
                    if raw:
                        return bytes(answer)
                    return self._decode(response, answer, views=views)
                error = self._error(response, answer)
                retryable = isinstance(error, Overloaded) or (
                    idempotent and type(error) is Unavailable
                )
                if not retryable:
                    raise error
                failure, retry_after = error, error.retry_after
            if attempt >= self._policy.retries:
                if isinstance(failure, ReplayError):
                    raise failure
                raise Unavailable(f"{method} {path} failed: {failure!r}") from failure
            await asyncio.sleep(self._policy.delay(attempt, retry_after))
            attempt += 1

    async def _exchange(
        self,
        method: str,
        path: str,
        content: bytes | Pieces | None,
        *,
        idempotent: bool,
        read_s: float | None,
        coded: bool = False,
    ) -> tuple[httpx.Response, bytes | bytearray | memoryview]:
        """One request (no retries), with the client's headers and timeouts: the answer and its
        body (with LeanTransport, a long body in the buffer it was read into).

        With our own LeanTransport the request goes straight to it: ``httpx.AsyncClient``
        would send the same bytes, but its per-request flows (auth, redirects, cookies,
        hooks), which this client never uses, are a visible share of the client's CPU per
        sampled batch (``python -m bench client``).
        """
        extensions: dict[str, Any] = dict(_IDEMPOTENT) if idempotent else {}
        timeout = self._timeout if read_s is None else httpx.Timeout(self._timeout_s, read=read_s)
        body_headers = {"Content-Type": MSGPACK} if content is not None else None
        if coded:
            body_headers = {"Content-Type": MSGPACK, "Content-Encoding": ZSTD}
        if self._lean is None:
            response = await self._http.request(
                method,
                self._url(path),
                content=content,
                headers=body_headers,
                timeout=timeout,
                extensions=extensions,
            )
            return response, response.content
        extensions["timeout"] = timeout.as_dict()
        headers = self._http.headers
        if body_headers is not None:
            headers = headers.copy()
            headers.update(body_headers)
        request = new_request(
            method, self._url(path), headers=headers, content=content, extensions=extensions
        )
        response, answer = await self._lean.fetch(request)
        response.request = request
        return response, answer

    @staticmethod
    def _decode(
        response: httpx.Response, answer: bytes | bytearray | memoryview, *, views: bool = False
    ) -> Any:
        if response.status_code == 204 or not answer:
            return None
        content_type = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
        try:
            if content_type in {MSGPACK, "application/x-msgpack"}:
                return decode_views(answer) if views else unpackb(answer)
            if isinstance(answer, memoryview):  # read into a receive buffer
                answer = bytes(answer)
            return from_jsonable(json.loads(answer))
        except ValueError as exc:
            raise ReplayError(f"undecodable answer ({content_type or 'no type'}): {exc}") from exc

    @staticmethod
    def _error(response: httpx.Response, answer: bytes | bytearray | memoryview) -> ReplayError:
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        try:
            body = Requester._decode(response, answer)
        except ReplayError:
            body = None
        return error_from_body(response.status_code, body, retry_after=retry_after)
