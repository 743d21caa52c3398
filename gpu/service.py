"""``rlreplay sidecar``: a :class:`GpuSampler` served over HTTP, for trainers that cannot
embed it.

* ``POST /v1/sample`` ``{"batch_size", "strategy"?, "fields"?, "seed"?}`` (JSON or msgpack)
  answers ``{"keys", "probabilities", "weights", "columns"}``, arrays as the contract's
  extension type 1 in msgpack (``{"$ndarray": ...}`` in JSON).
* ``GET /healthz``: 200 while the process runs; ``GET /readyz``: 200 once the device index
  is loaded and caught up with the server, 503 ``unavailable`` otherwise.
* ``GET /metrics``: Prometheus text: items held, lag behind the server (events and
  seconds), reloads, batches, selection and collection time.

The sampler connects in a task the app's lifespan owns: a server that is not up yet, or a
table not created yet, is tried again until it is, while ``/readyz`` says 503.

Every answer is capped before it is built: a sample whose keys and values would pass
``max_response_bytes`` is 422 ``validation_error``, as the server refuses one past its
``--max-response-mb``. The app sits behind :class:`~rlreplay.gpu.gate.RequestGate` (the
sidecar's own bearer keys, the request size limit); ``rlreplay sidecar`` adds the
connection rules of :mod:`rlreplay.gpu.connections`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rlreplay.clients.client import ReplayClient
from rlreplay.gpu.collection import BatchTooLarge
from rlreplay.gpu.error_answers import JSON, MSGPACK, error_answer, wants_msgpack
from rlreplay.gpu.gate import RequestGate
from rlreplay.gpu.sampler import GpuSampler
from rlreplay.wire.codec import packb, to_jsonable
from rlreplay.wire.errors import (
    BadRequest,
    ReplayError,
    Unavailable,
    UnsupportedMediaType,
    ValidationFailed,
)
from rlreplay.wire.schemas import SidecarSampleRequest

__all__ = ["SidecarConfig", "create_sidecar_app"]

log = logging.getLogger("rlreplay.gpu")

_PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
_MB = 1 << 20


@dataclass(frozen=True)
class SidecarConfig:
    """What ``rlreplay sidecar`` follows, where it draws, and what it accepts.

    Attributes:
        server: The replay server's URL.
        table: The table to follow.
        device: The torch device.
        server_api_key: The key the sidecar reads the server with.
        seed: Seed of the draws.
        retry_s: Pause between tries to load the table.
        api_keys: The sidecar's own bearer keys: ``/v1`` needs one when any is set.
        metrics_require_key: ``/metrics`` needs one of ``api_keys`` too.
        max_request_bytes: The largest request body accepted (413 past it).
        max_response_bytes: The largest answer built (422 before building one past it).
    """

    server: str
    table: str
    device: str = "cpu"
    server_api_key: str | None = None
    seed: int | None = None
    retry_s: float = 0.5
    api_keys: tuple[str, ...] = ()
    metrics_require_key: bool = False
    max_request_bytes: int = 1 * _MB
    max_response_bytes: int = 256 * _MB


class _SidecarMetrics(Collector):
    """The sampler's figures as Prometheus metrics, read when scraped."""

    def __init__(self, sampler: GpuSampler) -> None:
        self.sampler = sampler

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        d = self.sampler.describe()
        labels = {"table": self.sampler.table, "device": str(self.sampler.device)}
        names, values = list(labels), list(labels.values())

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(f"rlreplay_sidecar_{name}", doc, labels=names)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(f"rlreplay_sidecar_{name}", doc, labels=names)
            family.add_metric(values, value)
            return family

        yield gauge("items", "Items in the device index.", d["items"])
        yield gauge("lag_events", "Server events not applied yet.", d["lag_events"])
        lag_s = d["lag_s"] if d["lag_s"] != float("inf") else -1.0
        yield gauge("lag_seconds", "Seconds since last caught up (-1: never).", lag_s)
        yield gauge("seq", "The last server event applied.", d["seq"])
        yield counter("resyncs", "Reloads of the whole index from /index.", d["resyncs"])
        yield counter("events_applied", "Change events applied.", d["events_applied"])
        yield counter("batches", "Batches served.", d["batches"])
        yield counter("select_seconds", "Time spent selecting.", d["select_s"])
        yield counter("collect_seconds", "Time spent collecting values.", d["collect_s"])
        yield counter("collected_bytes", "Bytes of values collected.", d["bytes_collected"])


def _wants_msgpack(request: Request) -> bool:
    return wants_msgpack(request.headers.get("accept"))


def _parse(body: bytes, content_type: str) -> SidecarSampleRequest:
    media = content_type.partition(";")[0].strip().lower()
    try:
        if media in (MSGPACK, "application/x-msgpack"):
            return msgspec.msgpack.decode(body, type=SidecarSampleRequest)
        if media == JSON:
            return msgspec.json.decode(body, type=SidecarSampleRequest)
    except msgspec.ValidationError as exc:
        raise ValidationFailed(str(exc)) from exc
    except msgspec.DecodeError as exc:
        raise BadRequest(f"malformed body: {exc}") from exc
    raise UnsupportedMediaType(f"{media or 'no Content-Type'}: send JSON or msgpack")


def create_sidecar_app(
    config: SidecarConfig, *, transport: Any = None, client: ReplayClient | None = None
) -> Starlette:
    """The sidecar's ASGI app behind its gate; its lifespan opens the client and runs the
    sampler.

    Args:
        config: What to follow and where.
        transport: An httpx transport for the client (tests).
        client: A client to use instead of opening one (the caller closes it).
    """
    state: dict[str, Any] = {}

    async def connect(sampler: GpuSampler) -> None:
        last = ""
        while True:
            try:
                await sampler.start()
            except ReplayError as exc:
                # a warning when the reason changes; the tries every retry_s at debug
                level = logging.WARNING if str(exc) != last else logging.DEBUG
                log.log(level, "sidecar: cannot load table %r yet (%s)", config.table, exc)
                last = str(exc)
                await asyncio.sleep(config.retry_s)
                continue
            log.info("sidecar: following table %r of %s", config.table, config.server)
            state["ready"] = True
            return

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        own = client is None
        rb = client or ReplayClient(config.server, config.server_api_key, transport=transport)
        sampler = GpuSampler(
            rb,
            config.table,
            device=config.device,
            seed=config.seed,
            max_batch_bytes=config.max_response_bytes,
        )
        state.update(sampler=sampler, ready=False)
        registry = CollectorRegistry(auto_describe=True)
        registry.register(_SidecarMetrics(sampler))
        state["registry"] = registry
        connecting = asyncio.create_task(connect(sampler), name="rlreplay-sidecar-connect")
        try:
            yield
        finally:
            connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)
            await sampler.stop()
            if own:
                await rb.aclose()

    def ready_sampler() -> GpuSampler:
        sampler: GpuSampler = state["sampler"]
        if not state.get("ready"):
            raise Unavailable(f"not ready: loading table {config.table!r} from the server")
        return sampler

    async def sample(request: Request) -> Response:
        as_msgpack = _wants_msgpack(request)
        try:
            params = _parse(await request.body(), request.headers.get("content-type", ""))
            sampler = ready_sampler()
            try:
                batch = await sampler.sample(
                    params.batch_size,
                    strategy=params.strategy,
                    fields=params.fields,
                    seed=params.seed,
                )
            except BatchTooLarge as exc:
                raise ValidationFailed(
                    f"a sample of {exc.picks} picks would answer {exc.nbytes / _MB:.1f} MB of "
                    f"keys and values, past the sidecar's --max-response-mb "
                    f"({config.max_response_bytes / _MB:g}); ask for fewer"
                ) from exc
            except ValueError as exc:
                raise ValidationFailed(str(exc)) from exc
        except ReplayError as exc:
            return error_answer(exc, as_msgpack=as_msgpack)
        answer = {
            "keys": batch.keys,
            "probabilities": batch.probabilities.cpu().numpy(),
            "weights": batch.weights.cpu().numpy(),
            "columns": {name: _host(t) for name, t in batch.columns.items()},
        }
        if as_msgpack:
            return Response(packb(answer), media_type=MSGPACK)
        return Response(msgspec.json.encode(to_jsonable(answer)), media_type=JSON)

    async def healthz(request: Request) -> Response:
        return Response(msgspec.json.encode({"status": "ok"}), media_type=JSON)

    async def readyz(request: Request) -> Response:
        try:
            sampler = ready_sampler()
            if not sampler.follower.caught_up:
                error = sampler.follower.last_error or f"{sampler.follower.lag_events} behind"
                raise Unavailable(f"not caught up with the server: {error}")
        except ReplayError as exc:
            return error_answer(exc, as_msgpack=_wants_msgpack(request))
        return Response(msgspec.json.encode({"status": "ready"}), media_type=JSON)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(state["registry"]), media_type=_PROMETHEUS)

    async def internal(request: Request, exc: Exception) -> Response:
        log.exception("sidecar: %s %s failed", request.method, request.url.path, exc_info=exc)
        error = ReplayError(f"internal error: {exc!r}")
        return error_answer(error, as_msgpack=_wants_msgpack(request))

    routes = [
        Route("/v1/sample", sample, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    gate = Middleware(
        RequestGate,
        max_body_bytes=config.max_request_bytes,
        api_keys=config.api_keys,
        metrics_require_key=config.metrics_require_key,
    )
    return Starlette(
        routes=routes,
        middleware=[gate],
        lifespan=lifespan,
        exception_handlers={Exception: internal},
    )


def _host(tensor: torch.Tensor) -> Any:
    """A device tensor as the wire encodes it (bfloat16 stays a tensor: the codec packs it)."""
    host = tensor.cpu()
    return host if host.dtype == torch.bfloat16 else host.numpy()
