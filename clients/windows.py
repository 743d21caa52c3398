"""Windows of episode steps: what ``sample`` and ``stream`` answer on an episode table.

A window sample (``sample(table, B, length=T, burn_in=..., n_step=...)``) answers B windows
of ``W = burn_in + T`` consecutive steps, each of one episode (the contract's "Episode
tables"). :class:`WindowBatch` holds them as arrays with the batch on the first axis and the
window's steps on the second: ``columns[field]`` is ``[B, W, ...]``, ``mask[b, w]`` says
whether step ``w`` of window ``b`` is a stored step (False where ``pad`` ran past an
episode's last step), and with ``n_step`` the server's ``returns``, ``discount`` and
``next`` are ``[B, W]``, ``[B, W]`` and ``{field: [B, W, ...]}``.

As for :class:`~rlreplay.clients.columns.ColumnBatch`, the arrays are views of the buffer
the answer was read into, and :meth:`WindowBatch.as_torch` gives tensors sharing their
memory (:class:`WindowTensors`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from rlreplay.clients.columns import Column, column_tensor
from rlreplay.wire.arrays import BFloat16Array
from rlreplay.wire.errors import ReplayError, ValidationFailed

if TYPE_CHECKING:
    import torch

__all__ = ["WindowBatch", "WindowTensors"]

N = TypeVar("N", int, float)


@dataclass(slots=True)
class WindowTensors:
    """A :class:`WindowBatch` as torch tensors (:meth:`WindowBatch.as_torch`); each
    attribute is the batch's of the same name."""

    episodes: list[str]
    starts: torch.Tensor
    columns: dict[str, torch.Tensor]
    mask: torch.Tensor
    priorities: torch.Tensor
    probabilities: torch.Tensor
    weights: torch.Tensor
    times_sampled: torch.Tensor
    returns: torch.Tensor | None = None
    discount: torch.Tensor | None = None
    next: dict[str, torch.Tensor] = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        """The tensor of step field ``name``."""
        return self.columns[name]


@dataclass(slots=True)
class WindowBatch:
    """Sampled windows of episode steps (see the module).

    Attributes:
        episodes: Each window's episode.
        starts: Each window's first step within its episode (int64 ``[B]``), burn-in
            included: the priority of a window is its start's
            (``update_window_priorities`` takes ``(episodes[b], starts[b], ...)``).
        columns: Step field -> ``[B, W, ...]``; a frame-stacked field ``[B, W, k, ...]``.
        mask: bool ``[B, W]``: False for padding past an episode's last stored step.
        priorities: Each window start's priority (float64 ``[B]``).
        probabilities: The chance of each pick in one draw (float64 ``[B]``).
        weights: Importance-sampling weights (float64 ``[B]``).
        times_sampled: How often each start was drawn, this draw included (int64 ``[B]``).
        returns: With ``n_step``: float64 ``[B, W]``, the discounted sum of the next ``n'``
            rewards from each step (the answer's ``return``); None without.
        discount: With ``n_step``: float64 ``[B, W]``, ``gamma ** n'``, or 0 where a
            terminated episode ends within the n steps; None without.
        next: With ``n_step`` and ``next_fields``: field -> ``[B, W, ...]``, its value
            ``n'`` steps on (the episode's ``final`` at its end).
        draw_mass: What the server's draw was proportional to over the starts the request
            could draw (``Σ p^alpha`` for prioritized, their number otherwise). None from
            a server that does not say, and for a sharded sample's merged batch.
        selectable: How many starts the request could draw (None likewise).
    """

    episodes: list[str]
    starts: npt.NDArray[np.int64]
    columns: dict[str, Column]
    mask: npt.NDArray[np.bool_]
    priorities: npt.NDArray[np.float64]
    probabilities: npt.NDArray[np.float64]
    weights: npt.NDArray[np.float64]
    times_sampled: npt.NDArray[np.int64]
    returns: npt.NDArray[np.float64] | None = None
    discount: npt.NDArray[np.float64] | None = None
    next: dict[str, Column] = field(default_factory=dict)
    draw_mass: float | None = None
    selectable: int | None = None

    def __len__(self) -> int:
        return len(self.episodes)

    def __getitem__(self, name: str) -> Column:
        """The ``[B, W, ...]`` array of step field ``name``."""
        return self.columns[name]

    @property
    def window(self) -> int:
        """``W``: the steps of each window (burn-in included)."""
        return int(self.mask.shape[1]) if self.mask.ndim == 2 else 0

    def as_torch(self, device: Any = None, *, non_blocking: bool = False) -> WindowTensors:
        """The batch as torch tensors (imports torch).

        On the CPU every tensor shares its array's memory (arrays in a byte order other
        than the machine's are converted first, a copy); with ``device`` they are moved
        there (``non_blocking`` is passed to ``Tensor.to``).

        Raises:
            TypeError: A field's dtype has no torch dtype (strings, dates).
        """

        def tensor(name: str, column: Column) -> torch.Tensor:
            return column_tensor(name, column, device, non_blocking=non_blocking)

        return WindowTensors(
            episodes=list(self.episodes),
            starts=tensor("starts", self.starts),
            columns={name: tensor(name, column) for name, column in self.columns.items()},
            mask=tensor("mask", self.mask),
            priorities=tensor("priorities", self.priorities),
            probabilities=tensor("probabilities", self.probabilities),
            weights=tensor("weights", self.weights),
            times_sampled=tensor("times_sampled", self.times_sampled),
            returns=None if self.returns is None else tensor("return", self.returns),
            discount=None if self.discount is None else tensor("discount", self.discount),
            next={name: tensor(f"next {name}", column) for name, column in self.next.items()},
        )

    @classmethod
    def from_answer(cls, answer: Any) -> WindowBatch:
        """The batch of a decoded window-sample answer.

        Raises:
            ReplayError: The answer is not of that shape.
        """
        if not isinstance(answer, Mapping):
            raise ReplayError(f"expected a window sample's answer, got {type(answer).__name__}")
        try:
            batch = cls(
                episodes=[str(name) for name in answer["episodes"]],
                starts=_array(answer["starts"], np.int64),
                columns=_columns(answer["columns"]),
                mask=_array(answer["mask"], np.bool_),
                priorities=_array(answer["priorities"], np.float64),
                probabilities=_array(answer["probabilities"], np.float64),
                weights=_array(answer["weights"], np.float64),
                times_sampled=_array(answer["times_sampled"], np.int64),
                returns=_optional(answer.get("return")),
                discount=_optional(answer.get("discount")),
                next=_columns(answer.get("next") or {}),
                draw_mass=_number(answer.get("draw_mass"), float),
                selectable=_number(answer.get("selectable"), int),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayError(f"malformed window sample answer: {exc!r}") from exc
        return batch

    @classmethod
    def merged(
        cls, parts: Sequence[tuple[WindowBatch, npt.NDArray[np.intp]]], n: int
    ) -> WindowBatch:
        """One batch of ``n`` windows from several (a sharded sample's shards), each
        window at its place.

        Args:
            parts: Each part's batch and, per window, its place in ``range(n)``; together
                the places cover ``range(n)`` once.
            n: Windows in the merged batch.

        Raises:
            ValidationFailed: The parts' fields, dtypes or shapes differ (naming the field).
        """
        parts = [(batch, places) for batch, places in parts if len(batch)]
        if not parts:
            raise ValidationFailed("no shard answered a window")
        first = parts[0][0]
        episodes = [""] * n
        for batch, places in parts:
            for place, name in zip(places.tolist(), batch.episodes, strict=True):
                episodes[place] = name

        def merge(name: str, arrays: Sequence[Column]) -> Any:
            placed = [(a, places) for a, (_, places) in zip(arrays, parts, strict=True)]
            return _scatter(name, placed, n)

        def merge_map(maps: Sequence[dict[str, Column]], what: str) -> dict[str, Column]:
            names = sorted(maps[0])
            if any(sorted(other) != names for other in maps[1:]):
                raise ValidationFailed(f"the shards answered different {what}: {names}")
            return {name: merge(name, [m[name] for m in maps]) for name in names}

        def optional(values: Sequence[npt.NDArray[np.float64] | None], name: str) -> Any:
            if all(v is None for v in values):
                return None
            if any(v is None for v in values):
                raise ValidationFailed(f"some shards answered {name!r} and some did not")
            return merge(name, [v for v in values if v is not None])

        batches = [batch for batch, _ in parts]
        return cls(
            episodes=episodes,
            starts=merge("starts", [b.starts for b in batches]),
            columns=merge_map([b.columns for b in batches], "fields"),
            mask=merge("mask", [b.mask for b in batches]),
            priorities=merge("priorities", [b.priorities for b in batches]),
            probabilities=merge("probabilities", [b.probabilities for b in batches]),
            weights=merge("weights", [b.weights for b in batches]),
            times_sampled=merge("times_sampled", [b.times_sampled for b in batches]),
            returns=optional([b.returns for b in batches], "return"),
            discount=optional([b.discount for b in batches], "discount"),
            next=merge_map([b.next for b in batches], "next fields") if first.next else {},
        )


def _scatter(name: str, pieces: Sequence[tuple[Column, npt.NDArray[np.intp]]], n: int) -> Column:
    """``pieces``' rows at their places in an array of ``n`` rows."""
    arrays = [(a.bits if isinstance(a, BFloat16Array) else a, places) for a, places in pieces]
    bf16 = isinstance(pieces[0][0], BFloat16Array)
    dtype, shape = arrays[0][0].dtype, arrays[0][0].shape[1:]
    for (array, _), (piece, _) in zip(arrays, pieces, strict=True):
        if (
            array.dtype != dtype
            or array.shape[1:] != shape
            or isinstance(piece, BFloat16Array) != bf16
        ):
            raise ValidationFailed(
                f"field {name!r}: the shards answered {dtype}{list(shape)} and "
                f"{array.dtype}{list(array.shape[1:])}"
            )
    out = np.empty((n, *shape), dtype=dtype)
    for array, places in arrays:
        out[places] = array
    return BFloat16Array(out) if bf16 else out


def _columns(value: Any) -> dict[str, Column]:
    columns = dict(value)
    for name, column in columns.items():
        if not isinstance(column, np.ndarray | BFloat16Array):
            raise TypeError(f"field {name!r} is not an array")
    return columns


def _array(value: Any, dtype: type[np.generic]) -> Any:
    """An answer's array (a list, as JSON might give it, becomes one of ``dtype``)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, list):
        return np.asarray(value, dtype=dtype)
    raise TypeError(f"expected an array, got {type(value).__name__}")


def _number(value: Any, kind: type[N]) -> N | None:
    return None if value is None else kind(value)


def _optional(value: Any) -> npt.NDArray[np.float64] | None:
    return None if value is None else _array(value, np.float64)
