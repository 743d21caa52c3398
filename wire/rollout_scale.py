"""Wire shapes of rollout tables at scale: tags, ``where`` filters, reservations.

The contract's "Rollout tables at scale" section. :mod:`rlreplay.wire.schemas` uses the
aliases here in its push, patch, claim and sample bodies; the reservation bodies and
answers are here too, so the client and the server share one definition.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from msgspec import Meta, Struct

__all__ = [
    "DEFAULT_RESERVATION_TTL_S",
    "MAX_TAGS",
    "MAX_WORLD_SIZE",
    "ReservationAnswer",
    "ReservationRequest",
    "ReservationReturned",
    "TagName",
    "TagValue",
    "Tags",
    "Where",
]

#: Most tags one item carries.
MAX_TAGS = 16
#: Largest ``world_size`` of a claim.
MAX_WORLD_SIZE = 4096
#: Seconds a reservation's unfilled slots stay granted unless the request says otherwise.
DEFAULT_RESERVATION_TTL_S = 600.0
#: Longest ``ttl_s`` of a reservation (a day) and ``wait_ms`` (ten minutes).
_MAX_RESERVATION_TTL_S = 86_400.0
_MAX_WAIT_MS = 600_000

TagName = Annotated[str, Meta(min_length=1, max_length=128, examples=["dataset"])]
#: A tag's value: a string, an int, a float or a bool.
TagValue = str | int | float | bool
#: Decoded as any value and checked by the server, so that a tag of another kind (a list,
#: a map, null) is 422 ``validation_error`` like 17 tags: a well-formed body the contract
#: refuses, not a malformed one.
Tags = Annotated[
    dict[TagName, Any],
    Meta(
        max_length=MAX_TAGS,
        description="At most 16 tags: name -> string, int, float or bool.",
        examples=[{"dataset": "math", "difficulty": 3}],
        extra_json_schema={
            "additionalProperties": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "integer"},
                    {"type": "number"},
                    {"type": "boolean"},
                ]
            }
        },
    ),
]
#: ``{tag: value | {"in": [...]} | {"gte"?, "gt"?, "lte"?, "lt"?}}``: every condition must
#: hold (checked by the server's filter, which names a bad condition in a 422).
_SCALAR_SCHEMA: dict[str, Any] = {
    "anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]
}


def _range_schema(kind: str) -> dict[str, Any]:
    """A range of ``kind`` bounds: at most one lower and one upper bound, at least one."""
    return {
        "type": "object",
        "properties": {op: {"type": kind} for op in ("gte", "gt", "lte", "lt")},
        "minProperties": 1,
        "additionalProperties": False,
        "not": {"anyOf": [{"required": ["gt", "gte"]}, {"required": ["lt", "lte"]}]},
    }


Where = Annotated[
    dict[TagName, Any],
    Meta(
        description=(
            'Tag conditions, all of which must hold: a value (equal), `{"in": [...]}`, or '
            'a range `{"gte"?, "gt"?, "lte"?, "lt"?}` of numbers or of strings.'
        ),
        examples=[{"dataset": {"in": ["math", "code"]}, "difficulty": {"gte": 2}}],
        extra_json_schema={
            "additionalProperties": {
                "anyOf": [
                    _SCALAR_SCHEMA,
                    {
                        "type": "object",
                        "properties": {"in": {"type": "array", "items": _SCALAR_SCHEMA}},
                        "required": ["in"],
                        "additionalProperties": False,
                    },
                    _range_schema("number"),
                    _range_schema("string"),
                ]
            }
        },
    ),
]


class ReservationRequest(Struct, forbid_unknown_fields=True, gc=False):
    """Slots a generator asks for before it generates ``count`` rollouts at ``version``."""

    count: Annotated[int, Meta(ge=1, le=2**31 - 1, examples=[64])]
    version: Annotated[int, Meta(ge=0, le=2**63 - 1, description="The generator's policy.")]
    wait_ms: Annotated[
        int, Meta(ge=0, le=_MAX_WAIT_MS, description="How long to wait for one slot.")
    ] = 10_000
    ttl_s: Annotated[
        float,
        Meta(gt=0, le=_MAX_RESERVATION_TTL_S, description="Seconds until unfilled slots return."),
    ] = DEFAULT_RESERVATION_TTL_S

    EXAMPLE: ClassVar[dict[str, Any]] = {"count": 64, "version": 3, "wait_ms": 30_000}


class ReservationAnswer(Struct):
    """The slots granted (1 to ``count``) and when the unfilled ones return."""

    reservation: str
    granted: Annotated[int, Meta(ge=1)]
    expires_at: Annotated[float, Meta(description="Unix time, seconds.")]


class ReservationReturned(Struct):
    """How many unfilled slots a ``DELETE`` of a reservation gave back."""

    returned: Annotated[int, Meta(ge=0)]
