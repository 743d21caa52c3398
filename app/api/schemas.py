"""Pydantic models of the wire bodies, used only to document them in the OpenAPI schema.

Routes parse bodies themselves (:mod:`rlreplay.app.api.bodies`) so that item values stay raw
msgpack;
these models describe the same shapes, with examples, for ``/openapi.json`` and ``/docs``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from rlreplay.app.api.bodies import DEFAULT_TIMEOUT_MS, MAX_BATCH_SIZE, MAX_TIMEOUT_MS
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import MAX_KEY_BYTES

__all__ = [
    "REQUEST_MODELS",
    "Accepted",
    "DeleteRequest",
    "ErrorBody",
    "Health",
    "ItemList",
    "ItemOut",
    "KeysRequest",
    "PrioritiesRequest",
    "PrioritiesUpdated",
    "PushCommitted",
    "PushRequest",
    "SampleRequest",
    "SampleResponse",
    "TableInfo",
    "TableList",
]

#: An item key: 1 to 512 bytes of UTF-8 (the schema can only bound characters).
Key = Annotated[str, Field(min_length=1, max_length=MAX_KEY_BYTES)]
#: A priority: a finite number >= 0.
Priority = Annotated[float, Field(ge=0)]

_VALUE_DOC = (
    "Any msgpack value. In msgpack bodies arrays are extension type 1 "
    '(`[dtype, shape, data]`); in JSON, bytes are `{"$bytes": base64}`, arrays '
    '`{"$ndarray": {"dtype", "shape", "data": base64}}`, and NaN, Infinity and -Infinity '
    '`{"$float": "NaN"}`, `{"$float": "Infinity"}`, `{"$float": "-Infinity"}`. A stored '
    'value with no JSON form comes back over JSON as `{"$msgpack": base64}`.'
)
_VALUE_EXAMPLE: dict[str, Any] = {"obs": [0.1, 0.2, 0.3], "action": 1, "reward": 1.0}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(BaseModel):
    """What went wrong: a stable snake_case ``code`` and a message for a person."""

    code: str = Field(examples=["table_not_found"])
    message: str = Field(examples=["no table named 'rollouts'"])


class ErrorBody(BaseModel):
    """Every error answer: ``{"error": {"code", "message"}}``."""

    error: ErrorDetail


class ItemIn(_Strict):
    """One item to push; pushing an existing key replaces its value and priority."""

    key: str = Field(
        min_length=1,
        max_length=MAX_KEY_BYTES,
        description="1 to 512 bytes of UTF-8.",
        examples=["episode-17/step-3"],
    )
    value: Any = Field(description=_VALUE_DOC, examples=[_VALUE_EXAMPLE])
    priority: float = Field(1.0, ge=0, description="Finite, >= 0.", examples=[2.0])


class PushRequest(_Strict):
    """Items to push; with ``wait`` the answer comes once the writer applied them."""

    items: list[ItemIn]
    wait: bool = Field(False, description="Answer 200 once applied instead of 202 on accept.")

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "items": [{"key": "r1", "value": {"obs": [0.1, 0.2], "reward": 1.0}}],
                    "wait": False,
                }
            ]
        },
    )


class Accepted(BaseModel):
    """How many items the op accepted; readers see them at once, the writer applies them."""

    accepted: int = Field(ge=0, examples=[64])


class PushCommitted(BaseModel):
    """How many items the writer committed (push with ``wait: true``)."""

    committed: int = Field(ge=0, examples=[64])


class ItemOut(BaseModel):
    """A stored item."""

    key: str = Field(examples=["r1"])
    value: Any = Field(description=_VALUE_DOC, examples=[_VALUE_EXAMPLE])
    priority: float = Field(examples=[2.0])
    inserted_at: float = Field(description="Unix time of the insert.", examples=[1.7e9])
    times_sampled: int = Field(ge=0, examples=[0])


class ItemList(BaseModel):
    """Items in the order asked, null where a key is missing."""

    items: list[ItemOut | None]


class KeysRequest(_Strict):
    """Keys to read."""

    keys: list[Key] = Field(examples=[["r1", "r2"]])


class DeleteRequest(_Strict):
    """Keys to delete; missing keys are no error."""

    keys: list[Key] = Field(examples=[["r1", "r2"]])
    wait: bool = Field(False, description="Answer 200 once applied instead of 202 on accept.")


class SampleRequest(_Strict):
    """What to sample."""

    batch_size: int = Field(ge=1, le=MAX_BATCH_SIZE, examples=[64])
    timeout_ms: int = Field(
        DEFAULT_TIMEOUT_MS,
        ge=0,
        le=MAX_TIMEOUT_MS,
        description="How long the rate limiter may hold the sample before 504.",
    )
    include_values: bool = Field(True, description="false: values come back null.")


class SampledItemOut(BaseModel):
    """One pick of a sample."""

    key: str = Field(examples=["r1"])
    value: Any = Field(description=_VALUE_DOC, examples=[_VALUE_EXAMPLE])
    priority: float = Field(examples=[2.0])
    probability: float = Field(description="Chance of this pick in one draw.", examples=[0.01])
    weight: float = Field(description="Importance-sampling weight (1.0 but for prioritized).")
    times_sampled: int = Field(ge=0, examples=[1])


class SampleResponse(BaseModel):
    """The sampled items."""

    items: list[SampledItemOut]


class PrioritiesRequest(_Strict):
    """New priorities by key."""

    priorities: dict[Key, Priority] = Field(examples=[{"r1": 0.5, "r2": 3.0}])


class PrioritiesUpdated(BaseModel):
    """How many keys were updated, and how many were skipped as missing."""

    updated: int = Field(ge=0, examples=[1])
    missing: int = Field(ge=0, examples=[1])


class TableStats(BaseModel):
    """A table's figures (pending writes included)."""

    size: int = Field(ge=0)
    pending_ops: int = Field(ge=0)
    bytes_in_cache: int = Field(ge=0)
    bytes_on_disk: int = Field(ge=0)
    inserts: int = Field(ge=0)
    samples: int = Field(ge=0)
    deletes: int = Field(ge=0)
    evictions_to_disk: int = Field(ge=0)
    populates: int = Field(ge=0)


class TableInfo(BaseModel):
    """A table: its name, config and stats."""

    name: str = Field(examples=["default"])
    config: TableConfig
    stats: TableStats


class TableList(BaseModel):
    """Every table."""

    tables: list[TableInfo]


class Health(BaseModel):
    """Liveness or readiness."""

    status: str = Field(examples=["ok"])


#: Models of request bodies, added to the schema's components by :mod:`rlreplay.app.api.openapi`.
REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    TableConfig,
    PushRequest,
    KeysRequest,
    DeleteRequest,
    SampleRequest,
    PrioritiesRequest,
)
