"""Finds selector classes by name: the built-ins, then the ``rlreplay.samplers`` entry points."""

from __future__ import annotations

from typing import Any

from app.selection.base import Selector
from app.selection.uniform import UniformSampler

BUILTIN: dict[str, type[Selector]] = {cls.name: cls for cls in (UniformSampler,)}


def selector_class(name: str) -> type[Selector]:
    """The selector class registered under ``name``; ``ValueError`` naming it when unknown."""
    try:
        return BUILTIN[name]
    except KeyError:
        raise ValueError(f"unknown sampler type {name!r}") from None


def make_selector(name: str, params: dict[str, Any]) -> Selector:
    """A new selector; ``ValueError`` (naming the bad value) when the params are invalid."""
    cls = selector_class(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"sampler {name!r}: {exc}") from exc
