"""The item calls of the client: pushes (one request, or pipelined by a
:class:`~rlreplay.clients.writer.Writer`), reads, priorities, deletes and the table's change
feed (the contract's "Items")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from rlreplay.clients.bodies import ColumnsMeta, columns_request, push_request
from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.requester import Requester, answer_map, path_segment, table_path
from rlreplay.clients.rollouts import new_request_id
from rlreplay.clients.types import Item, Layout
from rlreplay.clients.writer import Writer
from rlreplay.wire.errors import ItemNotFound
from rlreplay.wire.schemas import (
    ColumnsPushRequest,
    DeleteRequest,
    ItemIn,
    KeysRequest,
    PrioritiesRequest,
    PushRequest,
)

__all__ = ["Items"]

_WAIT_MARGIN_S: Final = 5.0


class Items:
    """The item calls of :class:`~rlreplay.clients.client.ReplayClient`.

    Args:
        requester: Sends the calls to the server.
    """

    def __init__(self, requester: Requester) -> None:
        self._requester = requester

    async def push(
        self,
        table: str,
        items: Sequence[Mapping[str, Any]],
        *,
        wait: bool = False,
        reservation: str | None = None,
    ) -> int:
        """Insert or replace items.

        Args:
            table: The table.
            items: ``{"key": str, "value": any, "priority": float (optional)}`` each. Values
                may hold NumPy arrays and torch tensors.
            wait: Answer only once the writer has applied the items.
            reservation: The id of a reservation (:meth:`reserve`) the items fill.

        Returns:
            How many items were accepted (``wait=False``) or committed (``wait=True``); 0
            without a request when ``items`` is empty.

        Raises:
            Overloaded: The write queue stayed full through every retry.
            TableNotFound, ValidationFailed, PayloadTooLarge: As the contract says.
        """
        if not items:
            return 0
        return await self.push_body(table, push_request(items, wait, reservation))

    async def push_columns(
        self,
        table: str,
        keys: Sequence[str],
        columns: Mapping[str, Any],
        *,
        priorities: Any = None,
        wait: bool = False,
        tags: Sequence[Mapping[str, Any] | None] | None = None,
        groups: Sequence[str | None] | None = None,
        versions: Sequence[int | None] | None = None,
        reservation: str | None = None,
    ) -> int:
        """Insert or replace items given as columns, in one request.

        Item ``i`` is ``keys[i]`` with the value ``{field: columns[field][i], ...}``, stored
        exactly as :meth:`push` would store that value: a row of a column of two axes or more
        is an array, an element of a 1-D column the scalar NumPy gives (a float64, an int,
        a bool; complex and bfloat16 elements are 0-d arrays).

        Args:
            table: The table.
            keys: The items' keys.
            columns: Field -> NumPy array, torch tensor, ``BFloat16Array`` or list, its
                first axis ``len(keys)``.
            priorities: One per key (a sequence or a 1-D array); 1.0 each when None.
            wait: Answer only once the writer has applied the items.
            tags, groups, versions: One entry per key (None where an item has none), as
                :meth:`push`'s items carry them.
            reservation: The reservation whose slots these items fill.

        Returns:
            As :meth:`push`; 0 without a request when ``keys`` is empty.

        Raises:
            ValidationFailed: A column's first axis is not ``len(keys)``, a bad key or
                priority (the message names the field).
            TypeError: A column has no wire form (said before sending).
        """
        meta: ColumnsMeta = {
            "tags": tags,
            "groups": groups,
            "versions": versions,
            "reservation": reservation,
        }
        body = columns_request(keys, columns, priorities, wait, meta)
        if not body.keys:
            return 0
        return await self.push_body(table, body)

    def writer(self, table: str, *, max_in_flight: int = 8, batch_items: int = 64) -> Writer:
        """A pipelined writer into ``table`` (see :class:`~rlreplay.clients.writer.Writer`)::

            async with rb.writer("t", max_in_flight=8, batch_items=64) as w:
                await w.append(key, value, priority)

        Raises:
            TypeError: ``max_in_flight`` or ``batch_items`` is not an int.
            ValueError: ``max_in_flight`` or ``batch_items`` is below 1.
        """

        async def send(items: list[ItemIn]) -> int:
            return await self.push_body(table, PushRequest(items))

        return Writer(send, max_in_flight=max_in_flight, batch_items=batch_items)

    async def push_body(self, table: str, body: PushRequest | ColumnsPushRequest) -> int:
        body.request_id = new_request_id()  # its retries reuse it: a push applies once
        answer = await self._requester.call(
            "POST", table_path(table, "/items"), body=body, idempotent=True
        )
        counts = answer_map(answer)
        return int(counts.get("committed", counts.get("accepted", 0)))

    async def get(self, table: str, key: str) -> Item | None:
        """One item (``key``, ``value``, ``priority``, ``inserted_at``, ``times_sampled``).

        Returns:
            The item, or None when the table holds no such key.

        Raises:
            TableNotFound: No such table.
        """
        path = table_path(table, "/items/" + path_segment(key, "key"))
        try:
            return answer_map(await self._requester.call("GET", path, idempotent=True))
        except ItemNotFound:
            return None

    async def get_many(
        self, table: str, keys: Iterable[str], *, layout: Layout = "items"
    ) -> list[Item | None] | ColumnBatch:
        """Several items in one request, in the order asked; None where a key is missing.

        With ``layout="columns"``: a :class:`ColumnBatch` of the items found, each field of
        their values stacked (``missing`` lists the keys not found); values that do not
        stack raise ``ValidationFailed`` naming the field.

        Either way the arrays are views of the buffer the answer was read into, not copies
        (see :mod:`rlreplay.clients.columns`): that buffer is written again only once no
        array, tensor or view made from it is left, so an array stays valid, and the
        caller's, for as long as anything holds it; holding one item's array keeps the
        whole answer's buffer (``.copy()`` it to let the rest go). An array whose data is not
        aligned for its dtype in the answer is a copy.
        """
        body = KeysRequest(list(keys), layout)
        path = table_path(table, "/items:batchGet")
        answer = answer_map(
            await self._requester.call("POST", path, body=body, idempotent=True, views=True)
        )
        if layout == "columns":
            return ColumnBatch.from_answer(answer)
        return list(answer.get("items", []))

    async def get_many_packed(self, table: str, keys: Iterable[str]) -> bytes:
        """:meth:`get_many` with ``layout="columns"``, its msgpack answer left undecoded, for
        a caller that decodes the arrays straight into buffers of its own (the GPU sidecar).
        """
        body = KeysRequest(list(keys), "columns")
        path = table_path(table, "/items:batchGet")
        packed: bytes = await self._requester.call(
            "POST", path, body=body, idempotent=True, raw=True
        )
        return packed

    async def changes(
        self, table: str, since: int, *, limit: int = 10_000, wait_ms: int = 0
    ) -> dict[str, Any]:
        """The table's changes after event ``since`` (a long poll of up to ``wait_ms``).

        Returns:
            ``{"seq", "epoch", "events": [{"seq", "op", "key", "priority", "inserted_at"}]}``.

        Raises:
            Gone: ``since`` is older than the server keeps, or of another ``epoch``: reload
                with :meth:`table_index`.
        """
        path = table_path(table, f"/changes?since={since}&limit={limit}&wait_ms={wait_ms}")
        read_s = max(self._requester.timeout_s, wait_ms / 1000 + _WAIT_MARGIN_S)
        answer = await self._requester.call("GET", path, idempotent=True, read_timeout_s=read_s)
        return answer_map(answer)

    async def table_index(self, table: str) -> dict[str, Any]:
        """The table's whole selection state: ``{"seq", "epoch", "keys", "priorities",
        "inserted_at"}`` (NumPy columns), oldest insert first, as of event ``seq``."""
        return answer_map(
            await self._requester.call("GET", table_path(table, "/index"), idempotent=True)
        )

    async def update_priorities(
        self, table: str, priorities: Mapping[str, float]
    ) -> dict[str, int]:
        """Set items' priorities.

        Returns:
            ``{"updated": n, "missing": m}``: keys not in the table are skipped and counted.
        """
        body = PrioritiesRequest({key: float(value) for key, value in priorities.items()})
        path = table_path(table, "/priorities")
        answer = answer_map(await self._requester.call("POST", path, body=body, idempotent=True))
        return {"updated": int(answer.get("updated", 0)), "missing": int(answer.get("missing", 0))}

    async def delete(self, table: str, keys: Iterable[str]) -> int:
        """Delete items; keys not in the table are ignored.

        Returns:
            How many deletions the server accepted; 0 without a request when ``keys`` is empty.
        """
        body = DeleteRequest(list(keys), False, new_request_id())
        if not body.keys:
            return 0
        path = table_path(table, "/items:batchDelete")
        answer = answer_map(await self._requester.call("POST", path, body=body, idempotent=True))
        return int(answer.get("accepted", 0))
