"""Finds selector classes by name: the built-ins, then the ``rlreplay.samplers`` entry points.

A third-party distribution adds a sampler by declaring an entry point in that group,
whose name is the ``type`` used in a table config and whose object is a
:class:`~rlreplay.app.selection.base.Selector` subclass::

    [project.entry-points."rlreplay.samplers"]
    score = "rlreplay_score_sampler:HighestScoreSampler"

Built-in names cannot be overridden by a plugin.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from rlreplay.app.selection.base import Selector
from rlreplay.app.selection.heap import MaxHeapSelector, MinHeapSelector
from rlreplay.app.selection.insertion_order import FifoSelector, LifoSelector
from rlreplay.app.selection.prioritized import PrioritizedSampler
from rlreplay.app.selection.ptime import PTimeSampler
from rlreplay.app.selection.uniform import UniformSampler

ENTRY_POINT_GROUP = "rlreplay.samplers"

BUILTIN: dict[str, type[Selector]] = {
    cls.name: cls
    for cls in (
        UniformSampler,
        PrioritizedSampler,
        FifoSelector,
        LifoSelector,
        MaxHeapSelector,
        MinHeapSelector,
        PTimeSampler,
    )
}


def plugin_names() -> list[str]:
    """Names of the samplers installed as plugins (entry points), sorted."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} - BUILTIN.keys())


def selector_class(name: str) -> type[Selector]:
    """The selector class registered under ``name``.

    Built-ins come first; otherwise the entry point of that name in ``rlreplay.samplers``
    is loaded (each lookup asks ``importlib.metadata``, so a plugin installed while the
    service runs is found; Python caches the import itself).

    Raises:
        ValueError: no selector has that name, or its entry point does not load a
            ``Selector`` subclass; the message names it.
    """
    builtin = BUILTIN.get(name)
    if builtin is not None:
        return builtin
    matches = entry_points(group=ENTRY_POINT_GROUP, name=name)
    if not matches:
        known = sorted(BUILTIN) + plugin_names()
        raise ValueError(f"unknown sampler type {name!r} (known: {', '.join(known)})")
    entry_point = next(iter(matches))
    try:
        loaded = entry_point.load()
    except (ImportError, AttributeError) as exc:
        raise ValueError(
            f"sampler plugin {name!r} ({entry_point.value}) failed to load: {exc}"
        ) from exc
    if not (isinstance(loaded, type) and issubclass(loaded, Selector)):
        raise ValueError(
            f"sampler plugin {name!r} ({entry_point.value}) is not a Selector subclass"
        )
    return loaded


def make_selector(name: str, params: dict[str, Any]) -> Selector:
    """A new selector; ``ValueError`` (naming the bad value) when the params are invalid."""
    cls = selector_class(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"sampler {name!r}: {exc}") from exc
