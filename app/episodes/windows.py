"""Building a batch of windows ``[B, W, ...]`` from the steps an episode table stores.

Each window is read with one call of the table's step reader, over the range of steps it
needs: from ``k - 1`` steps before its start (the longest frame stack asked for) to ``n``
steps past its end (n-step returns and their ``next`` values), clipped to the episode. The
fields are then gathered from that range with array indexing:

- a plain field ``f``: ``columns[f][b, i] = f[s + i]``;
- a frame-stacked field (``frame_stack: {f: k}``): ``columns[f][b, i, j] = f[max(0, s + i -
  k + 1 + j)]``, the last ``k`` frames ending at step ``s + i``, the episode's first frame
  repeated before its start, built from frames stored once;
- steps past the last stored one (``pad: true``) are zeros with ``mask`` false;
- with ``n_step``: ``return``, ``discount`` (:mod:`~rlreplay.app.episodes.nstep`) and
  ``next[f][b, i]`` = ``f`` at step ``t + n'`` (stacked the same way when ``f`` is), the
  episode's ``final`` value at ``t + n' = L`` (zeros when it has none, the whole stack too).

A window never crosses into another episode: every value comes from its own episode's
range.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from rlreplay.app.episodes.fields import FieldSpec
from rlreplay.app.episodes.nstep import NStepTargets, nstep_targets
from rlreplay.app.episodes.window_starts import WindowShape
from rlreplay.wire.errors import ValidationFailed

__all__ = [
    "ReadSteps",
    "WindowBatch",
    "WindowRequest",
    "answer_bytes",
    "build_windows",
]

Ints = npt.NDArray[np.int64]
#: ``read(episode, start, stop, fields)`` -> ``{field: values of steps [start, stop)}``, each
#: with first axis ``stop - start``.
ReadSteps = Callable[[int, int, int, Sequence[str]], Mapping[str, npt.NDArray[np.generic]]]


@dataclass(frozen=True, slots=True)
class WindowRequest:
    """What a sample of windows returns, checked against the table's fields.

    Attributes:
        window: The windows' shape.
        fields: The step fields returned, in order.
        frame_stack: The table's ``frame_stack``: field -> k.
        gamma: ``gamma`` of n-step returns.
        reward_field: The field summed into ``return``.
        next_fields: The fields returned at ``t + n'`` under ``next``.
    """

    window: WindowShape
    fields: tuple[str, ...]
    frame_stack: Mapping[str, int] = field(default_factory=dict)
    gamma: float = 0.99
    reward_field: str = "reward"
    next_fields: tuple[str, ...] = ()

    def check(self, schema: Mapping[str, FieldSpec]) -> None:
        """Refuses fields the table does not have (422 naming it), a ``reward_field`` that
        is not one number per step, and ``next_fields`` without ``n_step``."""
        for name in (*self.fields, *self.next_fields):
            if name not in schema:
                known = ", ".join(sorted(schema)) or "none yet"
                raise ValidationFailed(f"field {name!r} is not a step field (fields: {known})")
        if self.next_fields and not self.window.n_step:
            raise ValidationFailed("next_fields needs n_step")
        if not (0.0 <= self.gamma <= 1.0):
            raise ValidationFailed(f"gamma ({self.gamma}) must be in [0, 1]")
        if self.window.n_step:
            spec = schema.get(self.reward_field)
            if spec is None:
                raise ValidationFailed(
                    f"reward_field {self.reward_field!r} is not a step field of the table"
                )
            if spec.shape != () or spec.np_dtype.kind not in "biuf":
                raise ValidationFailed(
                    f"reward_field {self.reward_field!r} must hold one number per step, "
                    f"not {spec.dtype} of shape {list(spec.shape)}"
                )

    def stack(self, name: str) -> int:
        """``k`` of a frame-stacked field, 0 for a plain one."""
        return int(self.frame_stack.get(name, 0))

    def reads(self) -> tuple[str, ...]:
        """Every field a window reads, each once."""
        names = [*self.fields, *self.next_fields]
        if self.window.n_step:
            names.append(self.reward_field)
        return tuple(dict.fromkeys(names))


@dataclass(slots=True)
class WindowBatch:
    """Windows as arrays.

    Attributes:
        columns: field -> ``[B, W, ...]`` (``[B, W, k, ...]`` for a stacked field).
        mask: ``[B, W]``: true where the step is stored.
        targets: the n-step ``return`` and ``discount`` (with ``n_step``).
        next: field -> ``[B, W, ...]`` at ``t + n'`` (with ``n_step``).
    """

    columns: dict[str, npt.NDArray[np.generic]]
    mask: npt.NDArray[np.bool_]
    targets: NStepTargets | None = None
    next: dict[str, npt.NDArray[np.generic]] | None = None


def answer_bytes(batch_size: int, request: WindowRequest, schema: Mapping[str, FieldSpec]) -> int:
    """The bytes of the arrays a batch of windows answers (what ``--max-response-mb`` caps)."""
    w = request.window.steps
    per_step = sum(schema[f].step_bytes * max(1, request.stack(f)) for f in request.fields)
    per_step += sum(schema[f].step_bytes * max(1, request.stack(f)) for f in request.next_fields)
    per_step += 1 + (16 if request.window.n_step else 0)  # mask; return and discount
    return batch_size * (w * per_step + 32)  # episode name aside: start, priority, p, weight...


def build_windows(
    *,
    episodes: Ints,
    starts: Ints,
    lengths: Ints,
    end_kinds: npt.NDArray[np.integer],
    finals: Sequence[Mapping[str, npt.NDArray[np.generic]] | None],
    request: WindowRequest,
    schema: Mapping[str, FieldSpec],
    read_steps: ReadSteps,
) -> WindowBatch:
    """The batch of windows starting at ``starts`` of ``episodes``.

    Args:
        episodes: ``[B]`` the episode (as ``read_steps`` names it) of each window.
        starts: ``[B]`` each window's first step.
        lengths: ``[B]`` the steps each episode holds (as the draw saw them).
        end_kinds: ``[B]`` how each episode ended.
        finals: each episode's ``final`` values, or None.
        request: What to return.
        schema: The table's step fields.
        read_steps: Reads a range of an episode's steps.

    Returns:
        The arrays of the batch.
    """
    b_size = len(starts)
    w = request.window.steps
    n = request.window.n_step
    mask = (starts[:, None] + np.arange(w)[None, :]) < lengths[:, None]
    columns = {f: _zeros(schema[f], b_size, w, request.stack(f)) for f in request.fields}
    nexts = {f: _zeros(schema[f], b_size, w, request.stack(f)) for f in request.next_fields}
    rewards = np.zeros((b_size, w + max(n - 1, 0)), dtype=np.float64)
    reads = request.reads()
    before = max([request.stack(f) for f in reads] + [1]) - 1
    ranges: list[tuple[int, Mapping[str, npt.NDArray[np.generic]]]] = []
    for b in range(b_size):
        s, length = int(starts[b]), int(lengths[b])
        lo, hi = max(0, s - before), min(length, s + w + n)
        chunk = read_steps(int(episodes[b]), lo, hi, reads)
        ranges.append((lo, chunk))
        valid = min(w, length - s)
        for name, out in columns.items():
            _gather(out[b, :valid], chunk[name], s + np.arange(valid), lo, request.stack(name))
        if n:
            got = min(w + n - 1, length - s)
            rewards[b, :got] = chunk[request.reward_field][s - lo : s - lo + got]
    if not n:
        return WindowBatch(columns, mask)
    targets = nstep_targets(
        starts=starts,
        lengths=lengths,
        end_kinds=end_kinds,
        rewards=rewards,
        steps=w,
        n=n,
        gamma=request.gamma,
    )
    for b, (lo, chunk) in enumerate(ranges):
        length = int(lengths[b])
        steps = targets.next_steps[b][mask[b]]
        inside = steps < length  # the others are t + n' = L: the episode's final
        at_final = np.flatnonzero(~inside)
        final = finals[b]
        for name, out in nexts.items():
            k = request.stack(name)
            _gather(out[b, : len(steps)], chunk[name], steps, lo, k, where=inside)
            last = None if final is None else final.get(name)
            if last is not None and len(at_final):
                with_final = np.concatenate([chunk[name], np.asarray(last)[None]])
                out[b, at_final] = _gathered(with_final, steps[at_final], lo, k)
    return WindowBatch(columns, mask, targets, nexts)


def _zeros(spec: FieldSpec, b: int, w: int, k: int) -> npt.NDArray[np.generic]:
    """A zero batch of a field: ``[B, W, ...]``, or ``[B, W, k, ...]`` when stacked."""
    return np.zeros((b, w, *((k,) if k else ()), *spec.shape), dtype=spec.np_dtype)


def _gathered(
    values: npt.NDArray[np.generic], steps: Ints, lo: int, k: int
) -> npt.NDArray[np.generic]:
    """The values at ``steps`` of a range read from step ``lo``: each step's value, or
    (``k`` > 0) the ``k`` frames ending at it, the first frame repeated before step 0."""
    if not k:
        picked: npt.NDArray[np.generic] = values[steps - lo]
        return picked
    stacked: npt.NDArray[np.generic] = values[np.maximum(_frames(steps, k), 0) - lo]
    return stacked


def _gather(
    out: npt.NDArray[np.generic],
    values: npt.NDArray[np.generic],
    steps: Ints,
    lo: int,
    k: int,
    *,
    where: npt.NDArray[np.bool_] | None = None,
) -> None:
    """Writes :func:`_gathered` into ``out`` (a view of the batch), at the positions
    ``where`` is true (all by default), copying each value once: a run of consecutive
    steps as one slice, anything else with ``np.take`` straight into ``out``."""
    if where is not None:
        at = np.flatnonzero(where)
        if len(at):
            out[at] = _gathered(values, steps[at], lo, k)
        return
    n = len(steps)
    if not n:
        return
    if not k and int(steps[-1]) - int(steps[0]) == n - 1:
        first = int(steps[0]) - lo
        out[...] = values[first : first + n]
        return
    if not out.flags.c_contiguous:
        out[...] = _gathered(values, steps, lo, k)
        return
    index = steps - lo if not k else np.maximum(_frames(steps, k), 0) - lo
    flat = out.reshape(-1, *values.shape[1:])  # a view: ``out`` is contiguous
    np.take(values, index.reshape(-1), axis=0, out=flat, mode="clip")


def _frames(steps: Ints, k: int) -> Ints:
    """The ``k`` steps ending at each of ``steps``: ``[len(steps), k]``."""
    frames: Ints = steps[:, None] - (k - 1) + np.arange(k)[None, :]
    return frames
