"""Non-2xx answers become the contract's exceptions."""

from __future__ import annotations

import httpx
import pytest

from rlreplay import clients
from rlreplay.clients import ReplayClient, ReplayError
from rlreplay.wire import errors as errors_module
from tests.clients.replay_fake import error

CASES = [
    (400, "bad_request", clients.BadRequest),
    (401, "unauthorized", clients.Unauthorized),
    (404, "table_not_found", clients.TableNotFound),
    (404, "item_not_found", clients.ItemNotFound),
    (404, "not_found", clients.NotFound),
    (404, "snapshot_not_found", clients.SnapshotNotFound),
    (404, "lease_not_found", clients.LeaseNotFound),
    (405, "method_not_allowed", clients.MethodNotAllowed),
    (409, "table_exists", clients.TableExists),
    (409, "not_configured", clients.NotConfigured),
    (409, "version_conflict", clients.VersionConflict),
    (409, "step_conflict", clients.StepConflict),
    (410, "gone", clients.Gone),
    (413, "payload_too_large", clients.PayloadTooLarge),
    (415, "unsupported_media_type", clients.UnsupportedMediaType),
    (422, "validation_error", clients.ValidationFailed),
    (503, "overloaded", clients.Overloaded),
    (503, "unavailable", clients.Unavailable),
    (504, "deadline_exceeded", clients.DeadlineExceeded),
    (507, "storage_full", clients.StorageFull),
]


def test_every_error_class_of_the_tree_is_covered() -> None:
    tree = {
        cls
        for cls in vars(errors_module).values()
        if isinstance(cls, type) and issubclass(cls, ReplayError) and cls is not ReplayError
    }
    assert tree == {cls for _, _, cls in CASES}


@pytest.mark.parametrize(("status", "code", "cls"), CASES)
@pytest.mark.parametrize("accept_json", [False, True])
async def test_error_bodies_become_their_class(
    status: int, code: str, cls: type[ReplayError], accept_json: bool
) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if accept_json:  # a server that answers JSON despite Accept
            request.headers["Accept"] = "application/json"
        return error(request, status, code, **{"Retry-After": "7"})

    async with ReplayClient("http://x", retries=0, transport=httpx.MockTransport(handler)) as rb:
        with pytest.raises(cls) as caught:
            await rb.describe_table("t")
    assert type(caught.value) is cls
    assert caught.value.code == code and caught.value.status == status
    assert caught.value.message == f"{code}!"
    assert caught.value.retry_after == 7.0


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(502, text="<html>bad gateway</html>", headers={"Content-Type": "text/html"}),
        httpx.Response(500, content=b"\xc1", headers={"Content-Type": "application/msgpack"}),
        httpx.Response(418, json={"error": {"code": "teapot", "message": "short and stout"}}),
    ],
    ids=["html", "garbage-msgpack", "unknown-code"],
)
async def test_unrecognised_errors_are_plain_replay_errors(response: httpx.Response) -> None:
    transport = httpx.MockTransport(lambda request: response)
    async with ReplayClient("http://x", retries=0, transport=transport) as rb:
        with pytest.raises(ReplayError) as caught:
            await rb.describe_table("t")
    assert type(caught.value) is ReplayError


async def test_an_undecodable_success_raises_replay_error() -> None:
    response = httpx.Response(200, content=b"\xc1", headers={"Content-Type": "application/msgpack"})
    transport = httpx.MockTransport(lambda request: response)
    async with ReplayClient("http://x", transport=transport) as rb:
        with pytest.raises(ReplayError, match="undecodable"):
            await rb.describe_table("t")
