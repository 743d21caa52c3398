"""The fields of an episode table's steps: names, dtypes and trailing shapes.

They are learned from the table's first append; every later append must name the same
fields with the same dtypes and trailing shapes, or it is refused naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlreplay.wire.arrays import dtype_info, wire_dtype
from rlreplay.wire.errors import ValidationFailed

__all__ = [
    "FieldSpec",
    "check_final",
    "check_steps",
    "learn_fields",
    "specs_from_state",
    "specs_state",
]


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One step field.

    Attributes:
        name: The field's name.
        dtype: Its wire dtype string (``"<f4"``, ``"|u1"``, ``"bfloat16"``).
        np_dtype: The NumPy dtype its values are held in (bfloat16 as ``<u2``).
        shape: The trailing shape of one step's value (``()`` for a scalar).
    """

    name: str
    dtype: str
    np_dtype: np.dtype[Any]
    shape: tuple[int, ...]

    @property
    def step_bytes(self) -> int:
        """Bytes of one step's value."""
        return int(math.prod(self.shape)) * self.np_dtype.itemsize

    @classmethod
    def of(cls, name: str, dtype: str, shape: tuple[int, ...]) -> FieldSpec:
        """The spec of a field of wire dtype ``dtype`` and trailing ``shape``."""
        wire, _, np_dtype = dtype_info(dtype)
        return cls(name, wire, np_dtype, tuple(shape))


def learn_fields(
    steps: Mapping[str, np.ndarray], dtypes: Mapping[str, str]
) -> dict[str, FieldSpec]:
    """The specs of a first append's ``steps`` (``dtypes``: the wire dtype of each field,
    where it differs from the array's own, as for bfloat16)."""
    return {
        name: FieldSpec.of(name, dtypes.get(name) or wire_dtype(array.dtype), array.shape[1:])
        for name, array in steps.items()
    }


def check_steps(
    specs: Mapping[str, FieldSpec], steps: Mapping[str, np.ndarray], dtypes: Mapping[str, str]
) -> int:
    """The number of steps in ``steps``, checked against the table's fields.

    Raises:
        ValidationFailed: A field is missing or unknown, its dtype or trailing shape differs,
            or the fields' first axes differ; the message names the field.
    """
    k: int | None = None
    for name, array in steps.items():
        spec = specs.get(name)
        if spec is None:
            raise ValidationFailed(
                f"steps[{name!r}]: the table's steps have no field {name!r} "
                f"(they have {sorted(specs)})"
            )
        if array.ndim == 0:
            raise ValidationFailed(f"steps[{name!r}] is 0-d: its first axis must be the steps")
        dtype = dtypes.get(name) or wire_dtype(array.dtype)
        if dtype != spec.dtype or tuple(array.shape[1:]) != spec.shape:
            raise ValidationFailed(
                f"steps[{name!r}] is {dtype} {list(array.shape[1:])} per step, but the "
                f"table's {name!r} is {spec.dtype} {list(spec.shape)}"
            )
        if k is None:
            k = int(array.shape[0])
        elif array.shape[0] != k:
            raise ValidationFailed(
                f"steps[{name!r}] holds {array.shape[0]} steps, the other fields {k}"
            )
    missing = sorted(set(specs) - set(steps))
    if missing:
        raise ValidationFailed(f"steps: the field {missing[0]!r} is missing")
    return k or 0


def check_final(specs: Mapping[str, FieldSpec], final: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """An end's ``final`` values as arrays of their fields' dtypes and trailing shapes.

    Raises:
        ValidationFailed: An unknown field, or a value that is not one step of its field.
    """
    out: dict[str, np.ndarray] = {}
    for name, value in final.items():
        spec = specs.get(name)
        if spec is None:
            raise ValidationFailed(f"end.final[{name!r}]: the table's steps have no such field")
        try:
            array = np.asarray(value)
            if array.dtype != spec.np_dtype:
                if array.dtype.kind not in "biuf" or not np.can_cast(
                    array.dtype, spec.np_dtype, casting="same_kind"
                ):
                    raise ValueError(f"{array.dtype} is not {spec.dtype}")
                array = array.astype(spec.np_dtype)
        except (TypeError, ValueError) as exc:
            raise ValidationFailed(f"end.final[{name!r}]: {exc}") from exc
        if tuple(array.shape) != spec.shape:
            raise ValidationFailed(
                f"end.final[{name!r}] has shape {list(array.shape)}, the field's steps "
                f"{list(spec.shape)}"
            )
        out[name] = np.ascontiguousarray(array)
    return out


def specs_state(specs: Mapping[str, FieldSpec]) -> list[list[Any]]:
    """The specs as plain data: ``[[name, dtype, shape], ...]``."""
    return [[s.name, s.dtype, list(s.shape)] for s in specs.values()]


def specs_from_state(state: list[list[Any]]) -> dict[str, FieldSpec]:
    """The specs :func:`specs_state` gave."""
    return {name: FieldSpec.of(name, dtype, tuple(shape)) for name, dtype, shape in state}
