"""What a log record says: one named kind per write the engine accepts, and its fields.

A record is the msgpack list ``[lsn, kind, version, table, *fields]``; the framing module
puts the LSN in front and checksums it. ``version`` is :data:`RECORD_VERSION` when written;
replay refuses a record of another version by name, so a log written by a newer server is
never half-understood. The builders here are the only code that lays records out, and
:func:`read_record` the only code that reads them back.

Kinds and their fields:

================ ==========================================================================
``create_table`` ``config``: the table's config as the contract spells it
``drop_table``   (none)
``put``          ``keys``, ``values`` (msgpack bytes), ``priorities``, ``inserted_at``,
                 and :data:`extras <put>` when there are any
``push_body``    ``inserted_at``, then the push body as the client sent it (the contract's
                 ``{"items": [...]}`` in msgpack), as one more element: logging the body as
                 it came spares encoding every item again
``push_columns`` ``keys``, ``priorities``, ``inserted_at``, ``extras`` (as ``put``'s, or an
                 empty map), then the ``columns`` map of a columnar push body as sent (field
                 name -> array, msgpack): replay builds the items' values from it as the API
                 did, which spares encoding every value
``delete``       ``keys``, and the write's ``request`` when it had an id
``priorities``   ``keys``, ``priorities``
``patch``        ``keys``, ``values`` (the merged values, msgpack bytes), ``request`` or nil,
                 and ``tags`` (each item's merged tags, nil where unchanged) when any are set
``ack``          ``task``, ``keys``: the task consumed those items
``version``      ``version``: the table's policy version moved forward
``episode_steps`` ``episode``, ``start``, ``k``, ``priorities`` (or nil), ``end`` (nil or
                 ``[reason, final]``, ``final`` the msgpack map of the final values or nil),
                 ``request`` or nil, then the ``steps`` map (field -> array, msgpack) as
                 the record's blob
``episode_delete`` ``episode``, ``request`` or nil
``episode_priorities`` ``windows``: ``[[episode, start, priority], ...]``
================ ==========================================================================

A write's ``request`` is ``[request_id, status, answer]``: replay remembers the id and its
answer for the idempotency window. A ``push_body`` needs none (the body holds the id).
Trailing elements a kind gained later are optional, so older logs replay as they did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Bumped whenever a kind's fields change; replay refuses other versions by name.
RECORD_VERSION = 1

CREATE_TABLE = "create_table"
DROP_TABLE = "drop_table"
PUT = "put"
PUSH_BODY = "push_body"
PUSH_COLUMNS = "push_columns"
DELETE = "delete"
PRIORITIES = "priorities"
PATCH = "patch"
ACK = "ack"
VERSION = "version"
EPISODE_STEPS = "episode_steps"
EPISODE_DELETE = "episode_delete"
EPISODE_PRIORITIES = "episode_priorities"
KINDS = frozenset(
    {
        CREATE_TABLE,
        DROP_TABLE,
        PUT,
        PUSH_BODY,
        PUSH_COLUMNS,
        DELETE,
        PRIORITIES,
        PATCH,
        ACK,
        VERSION,
        EPISODE_STEPS,
        EPISODE_DELETE,
        EPISODE_PRIORITIES,
    }
)


def create_table(table: str, config: dict[str, Any]) -> list[Any]:
    """A table was created with ``config`` (its wire form)."""
    return [CREATE_TABLE, RECORD_VERSION, table, config]


def drop_table(table: str) -> list[Any]:
    """A table and everything in it was dropped."""
    return [DROP_TABLE, RECORD_VERSION, table]


def put(
    table: str,
    keys: list[str],
    values: list[bytes],
    priorities: list[float],
    inserted_at: float,
    extras: dict[str, Any] | None = None,
) -> list[Any]:
    """Items were inserted or replaced. ``extras``: ``groups``, ``versions`` and ``tags``
    (a list each, None where an item has none), the ``reservation`` the push filled and the
    write's ``request``, when there are any."""
    record = [PUT, RECORD_VERSION, table, keys, values, priorities, inserted_at]
    if extras:
        record.append(extras)
    return record


def push_body(table: str, inserted_at: float) -> list[Any]:
    """Items were pushed in a body logged as sent: append the body as the record's blob."""
    return [PUSH_BODY, RECORD_VERSION, table, inserted_at]


def push_columns(
    table: str,
    keys: list[str],
    priorities: list[float],
    inserted_at: float,
    extras: dict[str, Any] | None = None,
) -> list[Any]:
    """Items were pushed as columns: append the body's ``columns`` map, as sent, as the
    record's blob. ``extras``: as :func:`put`'s (the write's ``request``)."""
    return [PUSH_COLUMNS, RECORD_VERSION, table, keys, priorities, inserted_at, extras or {}]


def delete(table: str, keys: list[str], request: list[Any] | None = None) -> list[Any]:
    """Items were deleted (``request``: the write's id and answer, when it had an id)."""
    record = [DELETE, RECORD_VERSION, table, keys]
    if request is not None:
        record.append(request)
    return record


def patch(
    table: str,
    keys: list[str],
    values: list[bytes],
    request: list[Any] | None,
    tags: list[dict[str, Any] | None] | None = None,
) -> list[Any]:
    """Items' values were patched: ``values`` are the merged ones; ``tags``: the merged
    tags of those whose tags the patch set."""
    record = [PATCH, RECORD_VERSION, table, keys, values, request]
    if tags is not None:
        record.append(tags)
    return record


def ack(table: str, task: str, keys: list[str]) -> list[Any]:
    """``task`` acknowledged (consumed) the items of ``keys``."""
    return [ACK, RECORD_VERSION, table, task, keys]


def version(table: str, value: int) -> list[Any]:
    """The table's policy version moved forward to ``value``."""
    return [VERSION, RECORD_VERSION, table, value]


def priorities(table: str, keys: list[str], values: list[float]) -> list[Any]:
    """Items' priorities were set."""
    return [PRIORITIES, RECORD_VERSION, table, keys, values]


def episode_steps(
    table: str,
    episode: str,
    start: int,
    k: int,
    priorities: list[float] | None,
    end: list[Any] | None,
    request: list[Any] | None,
) -> list[Any]:
    """Steps were appended to an episode: append the ``steps`` map as the record's blob."""
    return [EPISODE_STEPS, RECORD_VERSION, table, episode, start, k, priorities, end, request]


def episode_delete(table: str, episode: str, request: list[Any] | None) -> list[Any]:
    """An episode was deleted."""
    return [EPISODE_DELETE, RECORD_VERSION, table, episode, request]


def episode_priorities(table: str, windows: list[list[Any]]) -> list[Any]:
    """The priorities of windows ``[[episode, start, priority], ...]`` were set."""
    return [EPISODE_PRIORITIES, RECORD_VERSION, table, windows]


@dataclass(frozen=True, slots=True)
class LogRecord:
    """A record read back: its LSN, kind and table, and the kind's fields in order."""

    lsn: int
    kind: str
    table: str
    fields: tuple[Any, ...]


def read_record(record: list[Any]) -> LogRecord:
    """The record a replayed list holds (ValueError: not a record this server writes)."""
    if len(record) < 4:
        raise ValueError(f"a record of {len(record)} elements is too short")
    lsn, kind, version, table, *fields = record
    if kind not in KINDS:
        raise ValueError(f"unknown log record kind {kind!r}")
    if version != RECORD_VERSION:
        raise ValueError(
            f"a {kind!r} record of version {version!r}: this server reads version {RECORD_VERSION}"
        )
    return LogRecord(lsn, kind, table, tuple(fields))
