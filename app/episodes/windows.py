"""Building a batch of windows ``[B, W, ...]`` from the steps an episode table stores.

Each window reads the range of steps it needs: from ``k - 1`` steps before its start (the
longest frame stack asked for) to ``n`` steps past its end (n-step returns and their
``next`` values), clipped to the episode, one read per chunk of the range (each a view of
the chunk where it lies, nothing joined). The values are then copied straight into the
batch's arrays, each a slice copy per chunk (and per frame of a stack):

- a plain field ``f``: ``columns[f][b, i] = f[s + i]``;
- a frame-stacked field (``frame_stack: {f: k}``): ``columns[f][b, i, j] = f[max(0, s + i -
  k + 1 + j)]``, the last ``k`` frames ending at step ``s + i``, the episode's first frame
  repeated before its start, built from frames stored once;
- steps past the last stored one (``pad: true``) are zeros with ``mask`` false;
- a plain field named in ``sliced`` is not copied at all: its ``[B, W, ...]`` array is left
  as the slices of the chunks it lies in, window after window (zeros for padding), a
  :class:`WindowSlices` that an answer sends where the bytes lie;
- with ``n_step``: ``return``, ``discount`` (:mod:`~rlreplay.app.episodes.nstep`) and
  ``next[f][b, i]`` = ``f`` at step ``t + n'`` (stacked the same way when ``f`` is), the
  episode's ``final`` value at ``t + n' = L`` (zeros when it has none, the whole stack too).

A window never crosses into another episode: every value comes from its own episode's
range.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rlreplay.app.episodes.fields import FieldSpec
from rlreplay.app.episodes.nstep import NStepTargets, nstep_targets
from rlreplay.app.episodes.window_starts import WindowShape
from rlreplay.wire.errors import ValidationFailed

__all__ = [
    "Alloc",
    "ReadSteps",
    "WindowBatch",
    "WindowBuild",
    "WindowRequest",
    "WindowSlices",
    "answer_bytes",
    "build_windows",
]

Ints = npt.NDArray[np.int64]
#: ``read(episode, start, stop, fields)`` -> ``{field: values of steps [start, stop)}``, each
#: with first axis ``stop - start``.
ReadSteps = Callable[[int, int, int, Sequence[str]], Mapping[str, npt.NDArray[np.generic]]]
#: ``alloc(shape, dtype)``: an array for the batch, contents undefined.
Alloc = Callable[[tuple[int, ...], "np.dtype[Any]"], npt.NDArray[Any]]
#: Steps ``[start, stop)`` of a window's episode as read: ``(start, stop, {field: values})``.
Piece = tuple[int, int, Mapping[str, npt.NDArray[Any]]]


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


class WindowSlices:
    """A field of a batch of windows left where its steps lie: the bytes of its C-order
    ``[B, W, ...]`` array as buffers in order (slices of read-only chunks, and zeros),
    never written again. ``numpy.asarray`` joins them (a copy)."""

    __slots__ = ("dtype", "parts", "shape")

    def __init__(self, parts: list[memoryview], shape: tuple[int, ...], dtype: np.dtype[Any]):
        self.parts, self.shape, self.dtype = parts, shape, dtype

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.parts))

    def __array__(self, dtype: Any = None, copy: Any = None) -> npt.NDArray[Any]:
        joined = np.frombuffer(b"".join(self.parts), dtype=self.dtype).reshape(self.shape)
        return joined if dtype is None else joined.astype(dtype)

    def __getitem__(self, index: Any) -> Any:
        return np.asarray(self)[index]


@dataclass(slots=True)
class WindowBatch:
    """Windows as arrays.

    Attributes:
        columns: field -> ``[B, W, ...]`` (``[B, W, k, ...]`` for a stacked field), or its
            :class:`WindowSlices`.
        mask: ``[B, W]``: true where the step is stored.
        targets: the n-step ``return`` and ``discount`` (with ``n_step``).
        next: field -> ``[B, W, ...]`` at ``t + n'`` (with ``n_step``).
    """

    columns: dict[str, npt.NDArray[np.generic] | WindowSlices]
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


def _fresh(shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    return np.empty(shape, dtype=dtype)


class WindowBuild:
    """One batch of windows, built in two steps so that the copying may run off the loop.

    :meth:`read` (where the table is read: the event loop) takes each window's steps from
    the table, as read-only views of its chunks where they lie in one chunk (one read per
    chunk a window touches, or per window when ``chunk_steps`` is 0); :meth:`fill` then
    copies them into the batch's arrays, touching nothing of the table, so any thread may run
    it. :func:`build_windows` does both.

    Args:
        episodes: ``[B]`` the episode (as ``read_steps`` names it) of each window.
        starts: ``[B]`` each window's first step.
        lengths: ``[B]`` the steps each episode holds (as the draw saw them).
        end_kinds: ``[B]`` how each episode ended.
        finals: each episode's ``final`` values, or None.
        request: What to return.
        schema: The table's step fields.
        alloc: Makes the batch's large arrays (contents undefined: every element is written).
        sliced: Plain fields of ``request.fields`` left as :class:`WindowSlices` of the
            steps read (what they read must never change: sealed chunks, and the steps an
            open tail holds already); a stacked field named here is copied as any other.
    """

    def __init__(
        self,
        *,
        episodes: Ints,
        starts: Ints,
        lengths: Ints,
        end_kinds: npt.NDArray[np.integer],
        finals: Sequence[Mapping[str, npt.NDArray[np.generic]] | None],
        request: WindowRequest,
        schema: Mapping[str, FieldSpec],
        alloc: Alloc = _fresh,
        sliced: Collection[str] = (),
    ) -> None:
        self._episodes, self._starts, self._lengths = episodes, starts, lengths
        self._end_kinds, self._finals = end_kinds, finals
        self._request, self._schema = request, schema
        b, w = len(starts), request.window.steps
        self.mask = (starts[:, None] + np.arange(w)[None, :]) < lengths[:, None]
        #: The fields left as slices, not copied.
        self.sliced = [f for f in request.fields if f in sliced and not request.stack(f)]
        self.columns: dict[str, Any] = {
            f: self._array(alloc, f, b, w) for f in request.fields if f not in self.sliced
        }
        self.next = {f: self._array(alloc, f, b, w) for f in request.next_fields}
        self._pieces: list[list[Piece]] = []

    def _array(self, alloc: Alloc, name: str, b: int, w: int) -> npt.NDArray[Any]:
        spec, k = self._schema[name], self._request.stack(name)
        return alloc((b, w, *((k,) if k else ()), *spec.shape), spec.np_dtype)

    def ranges(self) -> list[tuple[int, int, int]]:
        """Each window's ``(episode, lo, hi)``: the steps it reads, from ``k - 1`` before its
        start (the longest frame stack) to ``n`` past its end, clipped to its episode."""
        request = self._request
        w, n = request.window.steps, request.window.n_step
        before = max([request.stack(f) for f in request.reads()] + [1]) - 1
        return [
            (e, max(0, s - before), min(length, s + w + n))
            for e, s, length in zip(
                self._episodes.tolist(),
                self._starts.tolist(),
                self._lengths.tolist(),
                strict=True,
            )
        ]

    def read(self, read_steps: ReadSteps, chunk_steps: int = 0) -> None:
        """Reads each window's steps (:meth:`ranges`), split where a chunk of
        ``chunk_steps`` steps ends (0: one read per window)."""
        reads = self._request.reads()
        for e, lo, hi in self.ranges():
            cuts = [lo, hi]
            if chunk_steps:
                first = (lo // chunk_steps + 1) * chunk_steps
                cuts[1:1] = range(first, hi, chunk_steps)
            self._pieces.append(
                [(a, z, read_steps(e, a, z, reads)) for a, z in itertools.pairwise(cuts)]
            )

    def fill(self) -> WindowBatch:
        """The batch: every array written from the steps :meth:`read` took."""
        request = self._request
        w, n = request.window.steps, request.window.n_step
        rewards = np.zeros((len(self._starts), w + max(n - 1, 0)), dtype=np.float64)
        for name in self.sliced:
            self.columns[name] = self._slices(name)
        self.columns = {f: self.columns[f] for f in request.fields}  # the request's order
        for b, pieces in enumerate(self._pieces):
            s, length = int(self._starts[b]), int(self._lengths[b])
            valid = min(w, length - s)
            for name, out in self.columns.items():
                if type(out) is not WindowSlices:
                    _copy_run(out[b], pieces, name, s, valid, request.stack(name))
            if n:
                got = min(w + n - 1, length - s)
                _copy_run(rewards[b], pieces, request.reward_field, s, got, 0)
        if not n:
            return WindowBatch(self.columns, self.mask)
        targets = nstep_targets(
            starts=self._starts,
            lengths=self._lengths,
            end_kinds=self._end_kinds,
            rewards=rewards,
            steps=w,
            n=n,
            gamma=request.gamma,
        )
        for b, pieces in enumerate(self._pieces):
            self._fill_next(b, pieces, targets.next_steps[b])
        return WindowBatch(self.columns, self.mask, targets, self.next)

    def _slices(self, name: str) -> WindowSlices:
        """Field ``name`` of every window as the slices of the steps read, and zeros."""
        spec, w = self._schema[name], self._request.window.steps
        step = spec.step_bytes
        parts: list[memoryview] = []
        zeros: memoryview | None = None
        for b, pieces in enumerate(self._pieces):
            s = int(self._starts[b])
            stop = s + min(w, int(self._lengths[b]) - s)
            for p0, p1, values in pieces:
                lo, hi = max(p0, s), min(p1, stop)
                if hi > lo:
                    rows = values[name][lo - p0 : hi - p0]
                    parts.append(np.ascontiguousarray(rows).data.cast("B"))
            if stop - s < w:
                zeros = memoryview(bytes(w * step)) if zeros is None else zeros
                parts.append(zeros[: (w - (stop - s)) * step])
        b = len(self._starts)
        return WindowSlices(parts, (b, w, *spec.shape), spec.np_dtype)

    def _fill_next(self, b: int, pieces: list[Piece], next_steps: Ints) -> None:
        """``next`` of window ``b``: steps ``t + n`` for as long as they are stored (one
        run), then the episode's ``final`` (the same stack for every step after)."""
        s, length = int(self._starts[b]), int(self._lengths[b])
        valid = min(self._request.window.steps, length - s)
        run = int(np.count_nonzero(next_steps[:valid] < length))
        final = self._finals[b]
        for name, out in self.next.items():
            k = self._request.stack(name)
            _copy_run(out[b], pieces, name, s + self._request.window.n_step, run, k)
            last = None if final is None else final.get(name)
            if run == valid or last is None:  # no final: zeros, the whole stack too
                continue
            if k:  # the stack ending at L: the one ending at L - 1, moved by a frame
                row = out[b, run]
                _copy_run(out[b, run : run + 1], pieces, name, length - 1, 1, k)
                row[:-1] = row[1:].copy()
                row[-1] = last
                out[b, run + 1 : valid] = row
            else:
                out[b, run:valid] = last


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
    chunk_steps: int = 0,
    alloc: Alloc = _fresh,
    sliced: Collection[str] = (),
) -> WindowBatch:
    """The batch of windows starting at ``starts`` of ``episodes`` (:class:`WindowBuild`'s
    :meth:`~WindowBuild.read` then :meth:`~WindowBuild.fill`, where the caller is)."""
    build = WindowBuild(
        episodes=episodes,
        starts=starts,
        lengths=lengths,
        end_kinds=end_kinds,
        finals=finals,
        request=request,
        schema=schema,
        alloc=alloc,
        sliced=sliced,
    )
    build.read(read_steps, chunk_steps)
    return build.fill()


#: Rows of frame-stack indices kept ready: ``_STACK_ROWS[k][i, j] = i + j``.
_ROWS = 256
_STACK_ROWS = {k: np.arange(_ROWS)[:, None] + np.arange(k)[None, :] for k in range(1, 17)}


def _copy_run(
    out: npt.NDArray[Any],
    pieces: Sequence[Piece],
    name: str,
    first: int,
    count: int,
    k: int,
) -> None:
    """Writes ``out[i] = f[first + i]`` for ``i < count`` (``k`` > 0: ``out[i, j] =
    f[first + i - k + 1 + j]``, the first frame repeated before step 0) from the ``pieces``
    read, and zeros past ``count``. Within one piece that is one gather (``np.take`` into
    the batch); across pieces a slice copy per piece and per ``j``. Either way a frame is
    copied once per stack it is in, straight into the batch."""
    if count < len(out):
        out[count:] = 0
    if count <= 0:
        return
    if len(pieces) == 1 and first - k + 1 >= 0:  # one chunk, no frame before step 0
        p0, _, values = pieces[0]
        src = values[name]
        at = first - p0
        if not k:
            out[:count] = src[at : at + count]
        else:  # one gather: the k frames of each row, into the batch
            rows = _STACK_ROWS.get(k)
            if rows is not None and count <= len(rows):
                index = rows[:count] + (at - k + 1)
            else:
                index = np.arange(count)[:, None] + np.arange(k)[None, :] + (at - k + 1)
            # mode "clip": the indices are in range, and "raise" would buffer the output
            np.take(src, index, axis=0, out=out[:count], mode="clip")
        return
    o = out if k else out[:, None]
    depth = max(k, 1)
    for j in range(depth):
        base = first - (depth - 1) + j  # the step at row 0 for this frame of the stack
        below = min(count, max(0, -base))  # rows before step 0: the first frame
        if below:
            o[:below, j] = pieces[0][2][name][0]
        for p0, p1, values in pieces:
            i0, i1 = max(below, p0 - base), min(count, p1 - base)
            if i1 > i0:
                o[i0:i1, j] = values[name][base + i0 - p0 : base + i1 - p0]
