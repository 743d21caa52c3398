"""The wire schemas of windows: sampling an episode table, and priorities per window start.

``POST /v1/tables/{table}/sample`` and ``POST /v1/tables/{table}/priorities`` take these
bodies on an episode table (the contract's "Episode tables"); an item table takes those of
:mod:`rlreplay.wire.schemas`. As there, request Structs refuse unknown fields.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from msgspec import UNSET, Meta, Struct, UnsetType, field

from rlreplay.wire.schemas import (
    DEFAULT_TIMEOUT_MS,
    MAX_BATCH_SIZE,
    MAX_KEY_BYTES,
    MAX_TIMEOUT_MS,
    NdArray,
)

__all__ = [
    "DEFAULT_ETA",
    "DEFAULT_GAMMA",
    "MAX_N_STEP",
    "MAX_WINDOW_STEPS",
    "WindowColumns",
    "WindowPrioritiesRequest",
    "WindowPriority",
    "WindowSampleRequest",
]

#: The most steps of one window (``burn_in + length``); the answer's size bounds it first.
MAX_WINDOW_STEPS = 1 << 20
#: The largest ``n_step``.
MAX_N_STEP = 10_000
#: ``gamma`` of a request that names none.
DEFAULT_GAMMA = 0.99
#: R2D2's ``eta``: the weight of ``max |td|`` in a window's priority.
DEFAULT_ETA = 0.9

_FieldName = Annotated[str, Meta(min_length=1, max_length=128)]
_Episode = Annotated[
    str, Meta(min_length=1, max_length=MAX_KEY_BYTES, description="1 to 512 bytes of UTF-8.")
]


class _Request(Struct, forbid_unknown_fields=True, gc=False):
    EXAMPLE: ClassVar[dict[str, Any]]


class WindowSampleRequest(_Request):
    """Windows to sample from an episode table: ``batch_size`` windows of ``burn_in +
    length`` consecutive steps of one episode each."""

    batch_size: Annotated[
        int,
        Meta(
            ge=0,
            le=MAX_BATCH_SIZE,
            examples=[64],
            description="0: no windows, only the figures of the starts it could draw "
            "(draw_mass, selectable), without waiting for one.",
        ),
    ]
    length: Annotated[
        int, Meta(ge=1, le=MAX_WINDOW_STEPS, description="T: the steps trained on.")
    ] = 1
    burn_in: Annotated[
        int,
        Meta(ge=0, le=MAX_WINDOW_STEPS, description="Steps before them (a recurrent warm-up)."),
    ] = 0
    start_every: Annotated[
        int, Meta(ge=1, le=MAX_WINDOW_STEPS, description="Windows start at multiples of this.")
    ] = 1
    pad: Annotated[
        bool, Meta(description="Windows may run past the last stored step (zeros, mask false).")
    ] = False
    fields: Annotated[
        list[_FieldName] | UnsetType, Meta(description="The step fields returned (all).")
    ] = UNSET
    n_step: (
        Annotated[int, Meta(ge=1, le=MAX_N_STEP, description="Adds return, discount, next.")]
        | UnsetType
    ) = UNSET
    gamma: Annotated[float, Meta(ge=0.0, le=1.0)] = DEFAULT_GAMMA
    reward_field: _FieldName = "reward"
    next_fields: list[_FieldName] = []
    timeout_ms: Annotated[
        int,
        Meta(
            ge=0,
            le=MAX_TIMEOUT_MS,
            description="How long to wait for the rate limiter and an eligible window before 504.",
        ),
    ] = DEFAULT_TIMEOUT_MS

    EXAMPLE: ClassVar[dict[str, Any]] = {
        "batch_size": 32,
        "length": 40,
        "burn_in": 20,
        "start_every": 20,
        "n_step": 3,
        "gamma": 0.99,
        "next_fields": ["obs"],
    }


class WindowPriority(_Request):
    """A window start's new priority, given or mixed from the window's ``|td|``."""

    episode: _Episode
    start: Annotated[int, Meta(ge=0)]
    priority: Annotated[float, Meta(ge=0.0, description="Finite, >= 0.")] | UnsetType = UNSET
    td: (
        Annotated[
            list[float],
            Meta(min_length=1, description="|TD error| of each step of the window sampled."),
        ]
        | UnsetType
    ) = UNSET


class WindowPrioritiesRequest(_Request):
    """New priorities of window starts: ``priority``, or ``eta·max|td| + (1 - eta)·mean|td|``."""

    windows: list[WindowPriority]
    eta: Annotated[float, Meta(ge=0.0, le=1.0)] = DEFAULT_ETA

    EXAMPLE: ClassVar[dict[str, Any]] = {
        "windows": [{"episode": "ep-1", "start": 20, "td": [0.5, 0.1, 2.0]}],
        "eta": 0.9,
    }


class WindowColumns(Struct):
    """Sampled windows: per window its episode and start, per field ``[B, W, ...]``."""

    episodes: list[str]
    starts: NdArray
    columns: Annotated[
        dict[str, NdArray],
        Meta(description="[B, W, ...] per field; [B, W, k, ...] for a frame-stacked one."),
    ]
    mask: NdArray
    priorities: NdArray
    probabilities: NdArray
    weights: NdArray
    times_sampled: NdArray
    draw_mass: Annotated[
        float,
        Meta(
            ge=0.0,
            description="The total draws were proportional to, over the starts the request "
            "could draw (sum of priority^exponent for prioritized; their number otherwise).",
        ),
    ]
    selectable: Annotated[int, Meta(ge=0, description="How many starts it could draw.")]
    # with n_step (``return`` on the wire: a Python keyword here)
    returns: NdArray | UnsetType = field(default=UNSET, name="return")
    discount: NdArray | UnsetType = UNSET
    next: dict[str, NdArray] | UnsetType = UNSET
