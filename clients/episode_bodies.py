"""The request bodies of episode tables: appends, window samples, window priorities.

An append's steps (and its ``final``) are packed by the codec when the append is made
(:func:`pending_append`), so that changing an array afterwards does not change what is
sent, and spliced into the body as :class:`msgspec.Raw`; its ``start`` is set when it is
sent (:meth:`PendingAppend.body`), which is how the episode writer numbers steps for the
caller. The checks here are the server's 422s, said before sending.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import numpy as np
from msgspec import UNSET, UnsetType

from rlreplay.clients.surface import WindowOptions
from rlreplay.wire.arrays import BFloat16Array, torch_tensor_type
from rlreplay.wire.codec import packb
from rlreplay.wire.episode_schemas import EndReason, EpisodeEnd, EpisodeStepsRequest
from rlreplay.wire.errors import ValidationFailed
from rlreplay.wire.schemas import DEFAULT_TIMEOUT_MS
from rlreplay.wire.window_schemas import (
    WindowPrioritiesRequest,
    WindowPriority,
    WindowSampleRequest,
)

__all__ = [
    "END_REASONS",
    "EndReason",
    "PendingAppend",
    "WindowStart",
    "pending_append",
    "priorities_body",
    "window_request",
    "window_sample",
]

END_REASONS: Final = ("terminated", "truncated")

WindowStart = tuple[str, int, Any]
"""``(episode, start, priority)``, or with ``eta`` ``(episode, start, td)``: the |TD errors|
of each step of the window sampled there."""

_WINDOW_OPTIONS: Final = WindowOptions.__optional_keys__


@dataclass(frozen=True, slots=True)
class PendingAppend:
    """An append checked and packed, waiting for its ``start``.

    Attributes:
        steps: The steps, packed (a map of field -> array).
        count: How many steps.
        priorities: One per step, or unset.
        end: ``{"reason", "final"?}``, or unset.
    """

    steps: msgspec.Raw
    count: int
    priorities: list[float] | UnsetType = UNSET
    end: EpisodeEnd | UnsetType = UNSET

    def body(self, start: int, *, wait: bool = False) -> EpisodeStepsRequest:
        """The request's body with the steps numbered from ``start``.

        Raises:
            ValidationFailed: ``start`` is negative.
        """
        if isinstance(start, bool) or not isinstance(start, int | np.integer) or start < 0:
            raise ValidationFailed(f"start ({start!r}) must be an int >= 0")
        return EpisodeStepsRequest(int(start), self.steps, self.priorities, self.end, UNSET, wait)

    def ended(self, end: EndReason, final: Mapping[str, Any] | None) -> PendingAppend:
        """This append with the episode's end added (the writer folds an ``end`` into the
        append waiting before it)."""
        return PendingAppend(self.steps, self.count, self.priorities, _end(end, final))


def _column(name: str, values: Any) -> Any:
    """A field's steps as the codec sends them (lists through ``np.asarray``)."""
    if isinstance(values, np.ndarray | BFloat16Array):
        return values
    tensor_type = torch_tensor_type()
    if tensor_type is not None and isinstance(values, tensor_type):
        return values
    array = np.asarray(values)
    if array.dtype == object:
        raise ValidationFailed(f"field {name!r}: steps must be arrays, not {type(values)}")
    return array


def _steps_count(steps: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """The steps as columns, and how many steps they hold.

    Raises:
        ValidationFailed: A field has no first axis, or the fields' first axes differ.
    """
    if not isinstance(steps, Mapping):
        raise ValidationFailed(f"steps must be a map of field -> array, not {type(steps)}")
    columns = {name: _column(name, values) for name, values in steps.items()}
    counts = {name: int(column.shape[0]) for name, column in columns.items() if column.shape}
    scalars = sorted(set(columns) - set(counts))
    if scalars:
        raise ValidationFailed(
            f"field {scalars[0]!r}: steps need a first axis (one row per step); one step of "
            "a scalar field is a 1-element array"
        )
    if len(set(counts.values())) > 1:
        raise ValidationFailed(f"the fields' first axes (steps) differ: {counts}")
    return columns, next(iter(counts.values()), 0)


def _end(end: EndReason, final: Mapping[str, Any] | None) -> EpisodeEnd:
    if end not in END_REASONS:
        raise ValidationFailed(f"end ({end!r}) must be one of {', '.join(END_REASONS)}")
    if final is None:
        return EpisodeEnd(end)
    return EpisodeEnd(end, msgspec.Raw(packb(dict(final))))


def pending_append(
    steps: Mapping[str, Any],
    *,
    priorities: Any = None,
    end: EndReason | None = None,
    final: Mapping[str, Any] | None = None,
) -> PendingAppend:
    """An append's steps, priorities and end, checked and packed now.

    Raises:
        ValidationFailed: Steps without a common first axis, ``priorities`` not one per
            step, an unknown ``end``, ``final`` without ``end``, neither steps nor end.
        TypeError: A value has no wire form.
    """
    columns, count = _steps_count(steps)
    if final is not None and end is None:
        raise ValidationFailed("final is the value after an episode's last step: give end too")
    if count == 0 and end is None:
        raise ValidationFailed("an append needs at least one step, or an end")
    prios: list[float] | UnsetType = UNSET
    if priorities is not None:
        prios = np.asarray(priorities, dtype=np.float64).reshape(-1).tolist()
        if len(prios) != count:
            raise ValidationFailed(f"{len(prios)} priorities for {count} steps")
    ending = UNSET if end is None else _end(end, final)
    return PendingAppend(msgspec.Raw(packb(columns)), count, prios, ending)


def window_sample(window: WindowOptions, layout: str, include_values: bool) -> bool:
    """Whether a ``sample`` call is a window sample: it has window options.

    Raises:
        TypeError: Window options with ``layout`` or ``include_values`` (items' options).
    """
    if window and (layout != "items" or not include_values):
        raise TypeError("a window sample takes neither layout nor include_values")
    return bool(window)


def window_request(
    batch_size: int, timeout_ms: int | None, window: WindowOptions
) -> WindowSampleRequest:
    """The body of a window sample: the options given, the server's defaults for the rest.

    Raises:
        TypeError: An option is unknown (as for a call with explicit keyword arguments).
    """
    unknown = sorted(window.keys() - _WINDOW_OPTIONS)
    if unknown:
        raise TypeError(f"sample() got unexpected keyword argument(s): {', '.join(unknown)}")
    body = WindowSampleRequest(
        batch_size, timeout_ms=DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms
    )
    options: dict[str, Any] = dict(window)
    for name, value in options.items():
        if value is None:
            continue  # fields, n_step, next_fields: None is the server's default
        setattr(body, name, list(value) if name in ("fields", "next_fields") else value)
    return body


def priorities_body(windows: Iterable[WindowStart], eta: float | None) -> WindowPrioritiesRequest:
    """The body of ``update_window_priorities``.

    Raises:
        ValidationFailed: A window is not ``(episode, start, priority or td)``.
    """
    entries: list[WindowPriority] = []
    for i, window in enumerate(windows):
        try:
            episode, start, value = window
        except (TypeError, ValueError):
            raise ValidationFailed(
                f"windows[{i}] ({window!r}) must be (episode, start, "
                f"{'priority' if eta is None else 'td'})"
            ) from None
        if eta is None:
            entries.append(WindowPriority(str(episode), int(start), priority=float(value)))
        else:
            td = np.abs(np.asarray(value, dtype=np.float64)).reshape(-1).tolist()
            entries.append(WindowPriority(str(episode), int(start), td=td))
    if eta is None:
        return WindowPrioritiesRequest(entries)
    return WindowPrioritiesRequest(entries, float(eta))
