"""The wire schemas: the one definition of each request body and answer of the HTTP contract.

Each body is a :class:`msgspec.Struct` with its fields' bounds (:class:`msgspec.Meta`),
descriptions and examples. Three users read the same classes:

* the server decodes request bodies with them, JSON and msgpack alike
  (:mod:`rlreplay.app.api.bodies`), and the write-ahead log's replay decodes logged push
  bodies with :class:`PushRequest`;
* the server's OpenAPI document is generated from them (:mod:`rlreplay.app.api.openapi`);
* the client encodes its requests with them (:mod:`rlreplay.clients.client`).

An item's ``value`` is :class:`msgspec.Raw`: in a msgpack body the value's bytes as sent,
which the server stores without decoding them; in a JSON body the value's JSON text, in the
contract's JSON form (see :mod:`rlreplay.wire.codec`). The client fills it with the value
packed by :func:`rlreplay.wire.codec.packb`.

What a Struct cannot state, the server checks itself: a key's limit is 512 bytes of UTF-8,
while ``Meta`` bounds characters (so a key of 300 ``é`` passes the schema and is refused);
a priority must be finite (``Meta(ge=0)`` refuses NaN, not infinity); a field that a
msgpack push body names twice is refused (msgspec keeps the last one). Request Structs
refuse unknown fields; answers may gain fields, so their Structs take any.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Literal

from msgspec import UNSET, Meta, Raw, Struct, UnsetType, field

from rlreplay.wire.rollout_scale import MAX_WORLD_SIZE, Tags, Where

__all__ = [
    "DEFAULT_PRIORITY",
    "DEFAULT_TIMEOUT_MS",
    "MAX_BATCH_SIZE",
    "MAX_CHANGES_LIMIT",
    "MAX_CHANGES_WAIT_MS",
    "MAX_KEY_BYTES",
    "MAX_TIMEOUT_MS",
    "Accepted",
    "Acked",
    "ChangeEvent",
    "ChangeList",
    "ClaimAnswer",
    "ClaimRequest",
    "ClaimedItem",
    "ColumnsPushRequest",
    "DeleteRequest",
    "ErrorBody",
    "ErrorDetail",
    "Health",
    "ItemColumns",
    "ItemIn",
    "ItemList",
    "ItemOut",
    "Key",
    "KeysRequest",
    "Layout",
    "LeaseKeysRequest",
    "NdArray",
    "NdArrayData",
    "PatchAnswer",
    "PatchItemIn",
    "PatchRequest",
    "PolicyVersion",
    "PrioritiesRequest",
    "PrioritiesUpdated",
    "Priority",
    "PushCommitted",
    "PushRequest",
    "Released",
    "RequestId",
    "SampleColumns",
    "SampleRequest",
    "SampleResponse",
    "SampledItemOut",
    "SidecarSampleRequest",
    "TableIndex",
    "TableInfo",
    "TableList",
    "TableStats",
    "TaskCounts",
    "TasksAnswer",
    "VersionAnswer",
    "VersionRequest",
]

#: The longest key, in bytes of UTF-8.
MAX_KEY_BYTES = 512
#: The priority of an item pushed without one.
DEFAULT_PRIORITY = 1.0
#: Largest ``batch_size`` of one sample request.
MAX_BATCH_SIZE = 65_536
#: ``timeout_ms`` of a sample request that names none.
DEFAULT_TIMEOUT_MS = 10_000
#: Longest ``timeout_ms`` accepted (ten minutes).
MAX_TIMEOUT_MS = 600_000

#: An item key: 1 to 512 bytes of UTF-8 (the schema can only bound characters).
Key = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=MAX_KEY_BYTES,
        description="1 to 512 bytes of UTF-8.",
        examples=["episode-17/step-3"],
    ),
]
#: A priority: a finite number >= 0. ``Meta`` refuses NaN here but not infinity, which the
#: server refuses itself (``le=`` the largest float would put that bound in the document).
Priority = Annotated[float, Meta(ge=0.0, description="Finite, >= 0.", examples=[2.0])]
_Count = Annotated[int, Meta(ge=0)]

_VALUE_DOC = (
    "Any msgpack value. In msgpack bodies arrays are extension type 1 "
    '(`[dtype, shape, data]`); in JSON, bytes are `{"$bytes": base64}`, arrays '
    '`{"$ndarray": {"dtype", "shape", "data": base64}}`, and NaN, Infinity and -Infinity '
    '`{"$float": "NaN"}`, `{"$float": "Infinity"}`, `{"$float": "-Infinity"}`. A stored '
    'value with no JSON form comes back over JSON as `{"$msgpack": base64}`.'
)
_VALUE_EXAMPLE: dict[str, Any] = {"obs": [0.1, 0.2, 0.3], "action": 1, "reward": 1.0}
_WAIT_DOC = "Answer 200 once applied instead of 202 on accept."
_GROUP_DOC = (
    "The rollouts of one prompt (GRPO-style groups): claims with `group_size` hand out "
    "whole groups."
)
_VERSION_DOC = "The policy version that generated the item (an int >= 0)."
_REQUEST_ID_DOC = (
    "1 to 128 characters: a repeat within the server's window is answered with the first "
    "answer and changes nothing."
)
#: The longest ``request_id``.
MAX_REQUEST_ID = 128
#: An idempotency key of a write.
RequestId = Annotated[
    str, Meta(min_length=1, max_length=MAX_REQUEST_ID, description=_REQUEST_ID_DOC)
]
#: A policy version: an int >= 0 that fits the engine's 64-bit columns.
PolicyVersion = Annotated[int, Meta(ge=0, le=2**63 - 1, description=_VERSION_DOC)]

#: The JSON form of an array (msgpack bodies carry extension type 1 instead), inlined where
#: a field is :class:`msgspec.Raw` and so has no schema of its own.
_NDARRAY_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "An array: extension type 1 in msgpack, this form in JSON.",
    "required": ["$ndarray"],
    "additionalProperties": False,
    "properties": {
        "$ndarray": {
            "type": "object",
            "required": ["dtype", "shape", "data"],
            "additionalProperties": False,
            "properties": {
                "dtype": {"type": "string", "examples": ["<f4"]},
                "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "data": {"type": "string", "description": "The C-order bytes, base64."},
            },
        }
    },
}

#: ``"items"``: one entry per item; ``"columns"``: each field of the values stacked.
Layout = Annotated[
    Literal["items", "columns"],
    Meta(
        description=(
            '`"columns"` answers each field of the items\' values (maps of arrays or '
            "scalars) stacked along a new first axis."
        )
    ),
]


# --- requests ---------------------------------------------------------------------------------


class _Request(Struct, forbid_unknown_fields=True, gc=False):
    """A request body: unknown fields are refused. Not tracked by the garbage collector: a
    body never holds a reference cycle."""

    #: An example body, shown in the OpenAPI document.
    EXAMPLE: ClassVar[dict[str, Any]]


class ItemIn(_Request):
    """One item to push; pushing an existing key replaces its value and priority."""

    key: Key
    value: Annotated[Raw, Meta(description=_VALUE_DOC, examples=[_VALUE_EXAMPLE])]
    priority: Priority = DEFAULT_PRIORITY
    group: Annotated[str | UnsetType, Meta(description=_GROUP_DOC)] = UNSET
    version: PolicyVersion | UnsetType = UNSET
    tags: Tags | UnsetType = UNSET


class PushRequest(_Request):
    """Items to push; with ``wait`` the answer comes once the writer applied them."""

    items: list[ItemIn]
    wait: Annotated[bool, Meta(description=_WAIT_DOC)] = False
    request_id: RequestId | UnsetType = UNSET
    reservation: (
        Annotated[str, Meta(max_length=64, description="A reservation these items fill.")]
        | UnsetType
    ) = UNSET

    EXAMPLE: ClassVar[dict[str, Any]] = {
        "items": [
            {"key": "r1", "value": {"obs": [0.1, 0.2], "reward": 1.0}, "priority": 2.0},
            {"key": "r2", "value": {"$bytes": "AAEC"}},
        ],
        "wait": False,
    }


class ColumnsPushRequest(_Request):
    """Items as columns: item `i` is `keys[i]` with the value `{field: columns[field][i]}`,
    stored exactly as if pushed in the per-item form."""

    keys: Annotated[list[Key], Meta(examples=[["r1", "r2"]])]
    columns: Annotated[
        Raw,
        Meta(
            description="Field name -> array whose first axis is `len(keys)`.",
            extra_json_schema={
                "type": "object",
                "minProperties": 1,
                "additionalProperties": _NDARRAY_SCHEMA,
            },
        ),
    ]
    priorities: Annotated[
        Raw | UnsetType,
        Meta(
            description="One per key (default 1.0 each): a list, or a 1-D array.",
            extra_json_schema={
                "anyOf": [
                    {"type": "array", "items": {"type": "number", "minimum": 0}},
                    _NDARRAY_SCHEMA,
                ]
            },
        ),
    ] = UNSET
    wait: Annotated[bool, Meta(description=_WAIT_DOC)] = False
    request_id: RequestId | UnsetType = UNSET
    tags: Annotated[
        list[Tags | None] | UnsetType, Meta(description="One map of tags (or null) per key.")
    ] = UNSET
    groups: Annotated[
        list[str | None] | UnsetType, Meta(description="One group (or null) per key.")
    ] = UNSET
    versions: Annotated[
        list[PolicyVersion | None] | UnsetType,
        Meta(description="One policy version (or null) per key."),
    ] = UNSET
    reservation: (
        Annotated[str, Meta(max_length=64, description="A reservation these items fill.")]
        | UnsetType
    ) = UNSET

    EXAMPLE: ClassVar[dict[str, Any]] = {
        "keys": ["r1", "r2"],
        "columns": {
            "obs": {
                "$ndarray": {"dtype": "<f4", "shape": [2, 2], "data": "zczMPc3MTD6amZk+zczMPg=="}
            },
            "reward": {
                "$ndarray": {"dtype": "<f8", "shape": [2], "data": "AAAAAAAA8D8AAAAAAAAAAA=="}
            },
        },
        "priorities": [2.0, 1.0],
        "wait": False,
    }


class KeysRequest(_Request):
    """Keys to read."""

    keys: Annotated[list[Key], Meta(examples=[["r1", "r2"]])]
    layout: Layout = "items"

    EXAMPLE: ClassVar[dict[str, Any]] = {"keys": ["r1", "r2"]}


class DeleteRequest(_Request):
    """Keys to delete; missing keys are no error."""

    keys: Annotated[list[Key], Meta(examples=[["r1", "r2"]])]
    wait: Annotated[bool, Meta(description=_WAIT_DOC)] = False
    request_id: RequestId | UnsetType = UNSET

    EXAMPLE: ClassVar[dict[str, Any]] = {"keys": ["r1", "r2"]}


class SampleRequest(_Request):
    """What to sample."""

    batch_size: Annotated[int, Meta(ge=1, le=MAX_BATCH_SIZE, examples=[64])]
    timeout_ms: Annotated[
        int,
        Meta(
            ge=0,
            le=MAX_TIMEOUT_MS,
            description="How long the rate limiter may hold the sample before 504.",
        ),
    ] = DEFAULT_TIMEOUT_MS
    include_values: Annotated[bool, Meta(description="false: values come back null.")] = True
    layout: Layout = "items"
    where: Where | UnsetType = UNSET

    EXAMPLE: ClassVar[dict[str, Any]] = {
        "batch_size": 64,
        "timeout_ms": DEFAULT_TIMEOUT_MS,
        "include_values": True,
    }


class PrioritiesRequest(_Request):
    """New priorities by key."""

    priorities: Annotated[dict[Key, Priority], Meta(examples=[{"r1": 0.5, "r2": 3.0}])]

    EXAMPLE: ClassVar[dict[str, Any]] = {"priorities": {"r1": 0.5}}


# --- rollout tables: fields, tasks, leases, policy versions -----------------------------------

#: A task's name (the consumer of a claim).
TaskName = Annotated[str, Meta(min_length=1, max_length=128, examples=["trainer"])]
#: A field of an item's value (a map).
FieldName = Annotated[str, Meta(min_length=1, max_length=256, examples=["reward"])]
#: Longest ``lease_s`` (a day) and ``wait_ms`` of a claim.
MAX_LEASE_S = 86_400.0


class PatchItemIn(_Request):
    """Fields to set in one existing item's value (a map); the others are kept."""

    key: Key
    fields: Annotated[
        Raw | UnsetType,
        Meta(
            description="Field name -> value: each is set in the item's value.",
            extra_json_schema={"type": "object", "minProperties": 1},
            examples=[{"reward": 1.0}],
        ),
    ] = UNSET
    tags: Annotated[Tags | UnsetType, Meta(description="Tags set on the item.")] = UNSET


class PatchRequest(_Request):
    """Fields to merge into existing items' values; missing keys are skipped and counted."""

    items: list[PatchItemIn]
    wait: Annotated[bool, Meta(description=_WAIT_DOC)] = False
    request_id: RequestId | UnsetType = UNSET

    EXAMPLE: ClassVar[dict[str, Any]] = {
        "items": [{"key": "r1", "fields": {"reward": 1.0}}],
        "request_id": "reward-model-7/batch-12",
    }


class PatchAnswer(Struct):
    """How many items a patch accepted (or committed), and how many keys were missing."""

    missing: Annotated[int, Meta(ge=0, examples=[0])]
    accepted: _Count | UnsetType = UNSET
    committed: _Count | UnsetType = UNSET


class ClaimRequest(_Request):
    """What a task claims: the oldest items ready for it, under a lease."""

    task: TaskName
    batch_size: Annotated[int, Meta(ge=1, le=MAX_BATCH_SIZE, examples=[64])]
    fields: Annotated[
        list[FieldName] | UnsetType,
        Meta(description="Hand out items that have all of these (all items when omitted)."),
    ] = UNSET
    group_size: (
        Annotated[
            int, Meta(ge=1, le=MAX_BATCH_SIZE, description="Hand out whole groups of this many.")
        ]
        | UnsetType
    ) = UNSET
    lease_s: Annotated[
        float, Meta(gt=0, le=MAX_LEASE_S, description="Seconds until the server releases it.")
    ] = 60.0
    wait_ms: Annotated[
        int, Meta(ge=0, le=MAX_TIMEOUT_MS, description="How long to wait for a batch.")
    ] = DEFAULT_TIMEOUT_MS
    partial: Annotated[
        bool, Meta(description="Past `wait_ms`, answer what is ready instead of 504.")
    ] = False
    min_version: PolicyVersion | UnsetType = UNSET
    where: Where | UnsetType = UNSET
    select: Annotated[
        list[FieldName] | UnsetType,
        Meta(description="The fields returned (default: `fields`, or the whole value)."),
    ] = UNSET
    values: Annotated[
        bool, Meta(description="false: no values, each selected field's length instead.")
    ] = True
    max_tokens: (
        Annotated[
            int, Meta(ge=1, le=2**62, description="Hand out items while their lengths sum within.")
        ]
        | UnsetType
    ) = UNSET
    length_field: Annotated[
        FieldName | UnsetType, Meta(description="The field whose length `max_tokens` counts.")
    ] = UNSET
    world_size: (
        Annotated[
            int, Meta(ge=1, le=MAX_WORLD_SIZE, description="Split the items into this many ranks.")
        ]
        | UnsetType
    ) = UNSET

    EXAMPLE: ClassVar[dict[str, Any]] = {
        "task": "trainer",
        "batch_size": 64,
        "fields": ["prompt", "response", "ref_logprob", "reward"],
        "group_size": 8,
    }


class ClaimedItem(Struct):
    """One item of a claim: only the fields asked for are in its value."""

    key: str
    priority: float
    group: str | None
    version: int | None
    value: Annotated[Any, Meta(description=_VALUE_DOC + " Absent with `values: false`.")] = UNSET
    tags: Annotated[dict[str, Any] | UnsetType, Meta(description="When it has any.")] = UNSET
    lengths: Annotated[
        dict[str, int] | UnsetType,
        Meta(description="With `values: false`: each selected field's length."),
    ] = UNSET


class ClaimAnswer(Struct):
    """A lease on the items handed out (the lease id is empty when none were)."""

    lease: str
    expires_at: Annotated[float, Meta(description="Unix time, seconds.")]
    items: list[ClaimedItem]
    ranks: Annotated[
        list[list[int]] | UnsetType,
        Meta(description="With `world_size`: indices into `items`, one list per rank."),
    ] = UNSET


class LeaseKeysRequest(_Request):
    """Keys of a lease (all of it when omitted)."""

    keys: list[Key] | UnsetType = UNSET

    EXAMPLE: ClassVar[dict[str, Any]] = {"keys": ["r1"]}


class Acked(Struct):
    """How many items the ack counted as consumed."""

    acked: _Count


class Released(Struct):
    """How many items are ready for the task again."""

    released: _Count


class VersionRequest(_Request):
    """The trainer's current policy version."""

    version: PolicyVersion
    force: Annotated[
        bool | UnsetType,
        Meta(
            description=(
                "Set a version more than 1,000,000 past the table's current one (refused "
                "with 422 otherwise, as a likely mistake that could drop every rollout as "
                "stale)."
            )
        ),
    ] = UNSET

    EXAMPLE: ClassVar[dict[str, Any]] = {"version": 3}


class VersionAnswer(Struct):
    """The table's policy version and the rollouts dropped as stale."""

    version: _Count
    dropped_stale: _Count


class TaskCounts(Struct):
    """One task's items: ready now, under a live lease, acknowledged, and lease expiries."""

    ready: _Count
    leased: _Count
    acked: _Count
    expired: _Count


class TasksAnswer(Struct):
    """Every task that claimed or acknowledged, with the table's version."""

    tasks: dict[str, TaskCounts]
    version: _Count
    dropped_stale: _Count
    reserved: Annotated[_Count, Meta(description="Reserved slots not filled yet.")] = 0


# --- answers ----------------------------------------------------------------------------------


class ErrorDetail(Struct):
    """What went wrong: a stable snake_case ``code`` and a message for a person."""

    code: Annotated[str, Meta(examples=["table_not_found"])]
    message: Annotated[str, Meta(examples=["no table named 'rollouts'"])]


class ErrorBody(Struct):
    """Every error answer: ``{"error": {"code", "message"}}``."""

    error: ErrorDetail


class Accepted(Struct):
    """How many items the op accepted; readers see them at once, the writer applies them."""

    accepted: Annotated[int, Meta(ge=0, examples=[64])]


class PushCommitted(Struct):
    """How many items the writer committed (a write with ``wait: true``)."""

    committed: Annotated[int, Meta(ge=0, examples=[64])]


class ItemOut(Struct):
    """A stored item."""

    key: Annotated[str, Meta(examples=["r1"])]
    value: Annotated[Any, Meta(description=_VALUE_DOC, examples=[_VALUE_EXAMPLE])]
    priority: Annotated[float, Meta(examples=[2.0])]
    inserted_at: Annotated[float, Meta(description="Unix time of the insert.", examples=[1.7e9])]
    times_sampled: Annotated[int, Meta(ge=0, examples=[0])]
    group: Annotated[str | UnsetType, Meta(description="Only when pushed with one.")] = UNSET
    version: Annotated[int | UnsetType, Meta(description="Only when pushed with one.")] = UNSET
    tags: Annotated[dict[str, Any] | UnsetType, Meta(description="When it has any.")] = UNSET


class ItemList(Struct):
    """Items in the order asked, null where a key is missing."""

    items: list[ItemOut | None]


class SampledItemOut(Struct):
    """One pick of a sample."""

    key: Annotated[str, Meta(examples=["r1"])]
    value: Annotated[Any, Meta(description=_VALUE_DOC, examples=[_VALUE_EXAMPLE])]
    priority: Annotated[float, Meta(examples=[2.0])]
    probability: Annotated[
        float, Meta(description="Chance of this pick in one draw.", examples=[0.01])
    ]
    weight: Annotated[
        float, Meta(description="Importance-sampling weight (1.0 but for prioritized).")
    ]
    times_sampled: Annotated[int, Meta(ge=0, examples=[1])]
    group: Annotated[str | UnsetType, Meta(description="Only when pushed with one.")] = UNSET
    version: Annotated[int | UnsetType, Meta(description="Only when pushed with one.")] = UNSET
    tags: Annotated[dict[str, Any] | UnsetType, Meta(description="When it has any.")] = UNSET


class SampleResponse(Struct):
    """The sampled items."""

    items: list[SampledItemOut]


class NdArrayData(Struct):
    """An array's dtype (with byte order, or `"bfloat16"`), shape and C-order bytes."""

    dtype: Annotated[str, Meta(examples=["<f4"])]
    shape: list[Annotated[int, Meta(ge=0)]]
    data: Annotated[str, Meta(description="base64")]


class NdArray(Struct):
    """An array: extension type 1 in msgpack answers, this form in JSON ones."""

    ndarray: NdArrayData = field(name="$ndarray")


_COLUMNS_DOC = (
    "Each field of the values stacked along a new first axis; a 1-D field of varying "
    'length packed end to end, with its int32 offsets (n + 1) as `"<field>.cu_seqlens"`.'
)


class SampleColumns(Struct):
    """A sample with `layout: "columns"`: one array per field, and per pick."""

    keys: list[str]
    priorities: NdArray
    probabilities: NdArray
    weights: NdArray
    times_sampled: NdArray
    columns: Annotated[dict[str, NdArray], Meta(description=_COLUMNS_DOC)]


class ItemColumns(Struct):
    """A batchGet with `layout: "columns"`: the keys found, stacked, and those missing."""

    keys: list[str]
    priorities: NdArray
    times_sampled: NdArray
    columns: Annotated[dict[str, NdArray], Meta(description=_COLUMNS_DOC)]
    missing: list[str]


class PrioritiesUpdated(Struct):
    """How many keys were updated, and how many were skipped as missing."""

    updated: Annotated[int, Meta(ge=0, examples=[1])]
    missing: Annotated[int, Meta(ge=0, examples=[1])]


class TableStats(Struct):
    """A table's figures (pending writes included)."""

    size: _Count
    pending_ops: _Count
    bytes_in_cache: _Count
    bytes_on_disk: _Count
    inserts: _Count
    samples: _Count
    deletes: _Count
    evictions_to_disk: _Count
    populates: _Count


class TableInfo(Struct):
    """A table: its name, config and stats."""

    name: Annotated[str, Meta(examples=["default"])]
    #: The server's ``TableConfig``, which the OpenAPI document links to by name: the
    #: config is the server's pydantic model, which this package may not import.
    config: Annotated[dict[str, Any], Meta(description="The table's `TableConfig`.")]
    stats: TableStats


class TableList(Struct):
    """Every table."""

    tables: list[TableInfo]


class Health(Struct):
    """Liveness or readiness."""

    status: Annotated[str, Meta(examples=["ok"])]


# --- snapshots ----------------------------------------------------------------------------------


class SnapshotRequest(_Request):
    """What to snapshot: every table, or those named (a restore then brings back those)."""

    tables: Annotated[
        list[str] | None,
        Meta(description="Tables to snapshot (all: omitted).", examples=[["default"]]),
    ] = None

    EXAMPLE: ClassVar[dict[str, Any]] = {"tables": ["default"]}


class Snapshot(Struct):
    """A complete snapshot at the backup URL."""

    id: Annotated[str, Meta(examples=["20261125T050102.123Z-3fa9c1"])]
    url: Annotated[str, Meta(description="Its manifest's URL.")]
    created_at: Annotated[float, Meta(description="Unix time, seconds.")]
    items: _Count
    bytes: _Count
    tables: list[str]


class SnapshotList(Struct):
    """The complete snapshots at the backup URL, newest first."""

    snapshots: list[Snapshot]


# --- the change feed and the GPU sidecar --------------------------------------------------------

#: Longest ``wait_ms`` of a change-feed long poll.
MAX_CHANGES_WAIT_MS = 60_000
#: Most events one ``/changes`` answer holds.
MAX_CHANGES_LIMIT = 100_000
_EPOCH_DOC = (
    "Names the feed the numbers belong to; a server restart or a re-created table starts a "
    "new feed with another epoch, and a follower then reloads from `/index`."
)


class ChangeEvent(Struct):
    """One change of a table's selection state, in the writer's order."""

    seq: Annotated[int, Meta(ge=1, examples=[42])]
    op: Annotated[
        Literal["put", "delete", "priority"],
        Meta(description="put: inserted or replaced; delete: gone; priority: new priority."),
    ]
    key: Annotated[str, Meta(examples=["r1"])]
    priority: Annotated[float | None, Meta(description="put and priority; null for delete.")]
    inserted_at: Annotated[float | None, Meta(description="put only: Unix time of the insert.")]


class ChangeList(Struct):
    """The changes after `since`, oldest first, and the number of the last one."""

    seq: Annotated[int, Meta(ge=0, description="The feed's last event.", examples=[42])]
    epoch: Annotated[int, Meta(ge=0, description=_EPOCH_DOC)]
    events: list[ChangeEvent]


class TableIndex(Struct):
    """A table's whole selection state as columns, oldest insert first, as of event `seq`."""

    seq: Annotated[int, Meta(ge=0, description="The feed's last event this state includes.")]
    epoch: Annotated[int, Meta(ge=0, description=_EPOCH_DOC)]
    keys: list[str]
    priorities: Annotated[NdArray, Meta(description="float64, one per key.")]
    inserted_at: Annotated[NdArray, Meta(description="float64 Unix times, one per key.")]


class SidecarSampleRequest(_Request):
    """What the GPU sidecar should select and collect."""

    batch_size: Annotated[int, Meta(ge=1, le=MAX_BATCH_SIZE, examples=[256])]
    strategy: Annotated[
        Literal["uniform", "prioritized", "topk", "fifo", "lifo", "ptime"],
        Meta(description="How to select."),
    ] = "uniform"
    fields: Annotated[
        list[str], Meta(description="Fields of the values to collect.", examples=[["obs"]])
    ] = []
    seed: Annotated[int, Meta(ge=0, description="Seed of this draw (fresh: null).")] | None = None

    EXAMPLE: ClassVar[dict[str, Any]] = {
        "batch_size": 256,
        "strategy": "prioritized",
        "fields": ["obs"],
    }
