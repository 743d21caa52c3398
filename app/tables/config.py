"""A table's configuration as the contract's ``TableConfig`` describes it."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from rlreplay.app.episodes.start_sampling import SUPPORTED as EPISODE_SAMPLERS
from rlreplay.app.selection.rate_limiters import RateLimiter

#: The largest count a config takes: the engine keeps counts in 64-bit signed integers.
MAX_COUNT = 2**63 - 1


def _number_not_text(value: Any) -> Any:
    """A count or a rate must be a number: pydantic's lax mode would take ``"5"`` and
    ``true``, which the schema refuses."""
    if isinstance(value, bool | str | bytes):
        raise PydanticCustomError(
            "number_type", "Input should be a number, not {kind}", {"kind": type(value).__name__}
        )
    return value


#: An int or a float of a config: numbers only (an integral float such as 8.0 is an int).
Count = Annotated[int, BeforeValidator(_number_not_text)]
Rate = Annotated[float, BeforeValidator(_number_not_text)]


class SamplerSpec(BaseModel):
    """``{"type": name, ...params}``; the params are validated by the sampler itself."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str = Field("uniform", min_length=1, max_length=128, examples=["prioritized"])

    @model_validator(mode="after")
    def _numbers_in_range(self) -> SamplerSpec:
        """Numbers among the params fit what the engine stores (finite, 64-bit)."""
        for name, value in (self.model_extra or {}).items():
            check_numbers(value, name)
        return self

    @property
    def params(self) -> dict[str, Any]:
        """The parameters other than ``type``."""
        return dict(self.model_extra or {})


class RemoverSpec(BaseModel):
    """Which item goes when the table is past ``max_size``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["fifo", "lifo", "uniform", "min_heap", "max_heap"] = "fifo"


class MinSizeLimiter(BaseModel):
    """Samples wait until the table holds ``min_size`` items."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["min_size"]
    min_size: Count = Field(1, ge=1, le=MAX_COUNT)


class SampleToInsertRatioLimiter(BaseModel):
    """Reverb's SampleToInsertRatio: keeps samples per insert near ``samples_per_insert``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["sample_to_insert_ratio"]
    min_size_to_sample: Count = Field(1, ge=1, le=MAX_COUNT)
    samples_per_insert: Rate = Field(1.0, gt=0, allow_inf_nan=False)
    error_buffer: Rate = Field(100.0, ge=0, allow_inf_nan=False)


class QueueLimiter(BaseModel):
    """Reverb's Queue: inserts wait when ``size`` items are unsampled, samples when none are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["queue"]
    size: Count = Field(..., ge=1, le=MAX_COUNT)


class AdmissionSpec(BaseModel):
    """Generation pacing: reserved slots plus unconsumed items stay within ``max_ahead``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_ahead: Count = Field(..., ge=1, le=MAX_COUNT)


class EpisodesSpec(BaseModel):
    """An episode table's settings: ``{"compression"?: "none" | "zstd", "frame_stack"?:
    {field: k}}``. A table with them holds episodes of steps instead of items, and its
    ``max_size`` counts steps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compression: Literal["none", "zstd"] = Field(
        "none", description="How sealed chunks of steps are stored."
    )
    frame_stack: dict[Annotated[str, Field(min_length=1, max_length=128)], Count] = Field(
        default_factory=dict,
        max_length=64,
        description="Fields sampled as the last k frames ending at each step; each frame "
        "is stored once.",
    )

    @model_validator(mode="after")
    def _stacks_positive(self) -> EpisodesSpec:
        for name, k in self.frame_stack.items():
            if not 1 <= k <= 1024:
                raise ValueError(f"frame_stack[{name!r}] ({k}) must be 1 to 1024")
        return self


RateLimiterSpec = Annotated[
    MinSizeLimiter | SampleToInsertRatioLimiter | QueueLimiter, Field(discriminator="type")
]


class TableConfig(BaseModel):
    """The contract's ``TableConfig``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sampler: SamplerSpec = Field(default_factory=lambda: SamplerSpec(type="uniform"))
    remover: RemoverSpec = Field(default_factory=lambda: RemoverSpec())
    max_size: Count | None = Field(None, ge=1, le=MAX_COUNT)
    max_times_sampled: Count = Field(0, ge=0, le=MAX_COUNT)
    rate_limiter: RateLimiterSpec | None = None
    max_staleness: Count | None = Field(
        None,
        ge=0,
        le=MAX_COUNT,
        description="Rollouts whose version is below the table's version minus this are "
        "dropped from claims and samples and deleted.",
    )
    delete_after_ack: tuple[Annotated[str, Field(min_length=1, max_length=128)], ...] = Field(
        (),
        max_length=64,
        description="An item acknowledged by every one of these tasks is deleted.",
    )
    admission: AdmissionSpec | None = Field(
        None, description="Reservations are granted while reserved + unconsumed <= max_ahead."
    )
    ttl_s: Rate | None = Field(
        None,
        gt=0,
        le=1e9,
        allow_inf_nan=False,
        description="Unconsumed items older than this are deleted, whole groups at a time.",
    )
    episodes: EpisodesSpec | None = Field(
        None,
        description="Makes an episode table: steps appended per episode, windows sampled; "
        "``max_size`` counts steps.",
    )

    @model_validator(mode="after")
    def _episodes_sampler(self) -> TableConfig:
        """An episode table's sampler picks window starts: only the types that apply."""
        if self.episodes is not None and self.sampler.type not in EPISODE_SAMPLERS:
            raise ValueError(
                f"sampler {self.sampler.type!r} does not apply to episode tables "
                f"(they take: {', '.join(EPISODE_SAMPLERS)})"
            )
        return self

    def to_wire(self) -> dict[str, Any]:
        """Plain JSON-able form (what is stored and answered); the rollout settings only
        when set, so a table that uses none reads as it always did."""
        wire = self.model_dump(mode="json")
        for name in _ROLLOUT_FIELDS:
            if wire[name] in (None, []):
                del wire[name]
        return wire


#: Settings of rollout and episode tables, left out of a config's wire form while unset.
_ROLLOUT_FIELDS = ("max_staleness", "delete_after_ack", "admission", "ttl_s", "episodes")


def check_numbers(value: Any, where: str) -> None:
    """Reject numbers a table cannot keep: integers past 64 bits, NaN and infinities
    (also inside lists and maps), raising ValueError that names ``where``."""
    if isinstance(value, bool):
        return
    if isinstance(value, int) and not -(2**63) <= value <= MAX_COUNT:
        raise ValueError(f"{where} ({value.bit_length()}-bit integer) is out of range")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} must be finite, not {value}")
    if isinstance(value, list | tuple):
        for i, element in enumerate(value):
            check_numbers(element, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, element in value.items():
            check_numbers(element, f"{where}.{key}" if where else str(key))


def make_rate_limiter(spec: RateLimiterSpec | None) -> RateLimiter:
    """The limiter a table config's ``rate_limiter`` describes.

    None gives a limiter of kind ``"none"`` that behaves as ``min_size`` 1 (Reverb's
    default, ``MinSize(1)``: samples wait while the table is empty); a gate around it
    reports ``limited`` False, so a table may skip the gate and wait for an item itself.
    """
    if spec is None:
        return RateLimiter("none", 1.0, 1, -math.inf, math.inf)
    if isinstance(spec, MinSizeLimiter):
        return RateLimiter("min_size", 1.0, spec.min_size, -math.inf, math.inf)
    if isinstance(spec, SampleToInsertRatioLimiter):
        offset = spec.samples_per_insert * spec.min_size_to_sample
        return RateLimiter(
            "sample_to_insert_ratio",
            spec.samples_per_insert,
            spec.min_size_to_sample,
            offset - spec.error_buffer,
            offset + spec.error_buffer,
        )
    if isinstance(spec, QueueLimiter):
        return RateLimiter("queue", 1.0, 1, 0.0, float(spec.size))
    raise ValueError(f"unknown rate limiter spec {spec!r}")
