"""The wire schemas of episode tables' appends and reads (see the contract's "Episode
tables"); shared by the server, which decodes appends with them, the OpenAPI document and
the client.

``steps`` and ``final`` are :class:`msgspec.Raw`: in msgpack the maps as sent (arrays are
extension type 1, read where they lie), in JSON their text (arrays in the contract's
``{"$ndarray": ...}`` form; plain lists and numbers are taken as NumPy makes them).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Literal

from msgspec import UNSET, Meta, Raw, Struct, UnsetType

from rlreplay.wire.schemas import RequestId

__all__ = [
    "EndReason",
    "EpisodeAnswer",
    "EpisodeEnd",
    "EpisodeStepsRequest",
]

#: How an episode ended: Gymnasium's ``terminated`` (no bootstrap) or ``truncated``.
EndReason = Literal["terminated", "truncated"]

_NDARRAY: Final[dict[str, Any]] = {
    "type": "object",
    "description": "An array: extension type 1 in msgpack, "
    '`{"$ndarray": {"dtype", "shape", "data": "<base64>"}}` in JSON.',
}
_WAIT_DOC = "Answer once the writer has applied it (200 `committed`), not once logged (202)."


class EpisodeEnd(Struct, forbid_unknown_fields=True, gc=False):
    """Ends the episode after the append's steps."""

    reason: Annotated[EndReason, Meta(examples=["truncated"])]
    final: Annotated[
        Raw | UnsetType,
        Meta(
            description="The fields' values after the last step (Gymnasium's last "
            "observation), to bootstrap a truncated episode.",
            extra_json_schema={"type": "object", "additionalProperties": _NDARRAY},
        ),
    ] = UNSET


class EpisodeStepsRequest(Struct, forbid_unknown_fields=True, gc=False):
    """Steps appended to an episode, numbered from ``start`` (the number it holds)."""

    EXAMPLE: ClassVar[dict[str, Any]] = {
        "start": 0,
        "steps": {
            "obs": {"$ndarray": {"dtype": "<f4", "shape": [2, 4], "data": "A" * 44}},
            "action": [0, 1],
            "reward": [1.0, 1.0],
        },
        "end": {"reason": "truncated"},
    }

    start: Annotated[
        int,
        Meta(
            ge=0,
            le=2**63 - 1,
            description="The number of steps the episode holds (0 for a new one).",
        ),
    ]
    steps: Annotated[
        Raw,
        Meta(
            description="Field name -> array whose first axis is the steps (k of them), "
            "the same fields, dtypes and trailing shapes for every step of the table.",
            extra_json_schema={"type": "object", "additionalProperties": _NDARRAY},
        ),
    ]
    priorities: Annotated[
        list[Annotated[float, Meta(ge=0)]] | UnsetType,
        Meta(description="One per step: the priority of the window starting there."),
    ] = UNSET
    end: EpisodeEnd | UnsetType | None = UNSET
    request_id: RequestId | UnsetType = UNSET
    wait: Annotated[bool, Meta(description=_WAIT_DOC)] = False


class EpisodeAnswer(Struct):
    """Steps ``[start, stop)`` of an episode."""

    episode: Annotated[str, Meta(examples=["ep-7"])]
    length: Annotated[int, Meta(ge=0, description="The steps the episode holds.")]
    end: Annotated[EndReason | None, Meta(description="null while the episode is open.")]
    steps: Annotated[
        dict[str, Any],
        Meta(
            description="Field name -> the steps' array.",
            extra_json_schema={"type": "object", "additionalProperties": _NDARRAY},
        ),
    ]
    start: Annotated[int, Meta(ge=0, description="The number of the first step given.")] = 0
    final: Annotated[
        dict[str, Any] | UnsetType,
        Meta(description="The final values, once the episode ended with some."),
    ] = UNSET
