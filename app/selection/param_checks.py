"""Eager checks of selector parameters; each error names the parameter and its bad value."""

from __future__ import annotations

import math


def real(name: str, value: object) -> float:
    """``value`` as a finite float; ``ValueError`` naming it when it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} ({value!r}) must be a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} ({value!r}) must be finite")
    return number


def at_least_zero(name: str, value: object) -> float:
    """``value`` as a float ``>= 0``; ``ValueError`` naming it otherwise."""
    number = real(name, value)
    if number < 0:
        raise ValueError(f"{name} ({number!r}) must be >= 0")
    return number


def above_zero(name: str, value: object) -> float:
    """``value`` as a float ``> 0``; ``ValueError`` naming it otherwise."""
    number = real(name, value)
    if number <= 0:
        raise ValueError(f"{name} ({number!r}) must be > 0")
    return number
