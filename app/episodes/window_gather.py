"""Short windows of many episodes (n-step transitions) built by one gather per field.

:class:`~rlreplay.app.episodes.windows.WindowBuild` reads each window's steps and copies
them window by window: right for long windows, where each copy is a long run of a chunk,
but for a batch of hundreds of windows of a step or a few its Python per window is most of
the work. :class:`WindowGather` builds the same batch (the same values, bit for bit) with
work per *chunk* instead:

- :meth:`WindowGather.read` finds the distinct chunks the batch's windows touch (each
  ``(episode, chunk)`` once, however many windows share it) and reads each once, as a view
  where it lies (its decompression left to the copy, as for a window build);
- :meth:`WindowGather.fill` computes, for every value of the batch, the step it holds (the
  window's step, the frames of its stack, the step ``t + n'`` of ``next``) as arrays, maps
  each to its chunk and offset, and gathers every field for the whole batch: a field of a
  few bytes a step with one ``take`` over its chunks laid end to end, a large one (frames)
  with one ``take`` per chunk, straight into the batch; or, for a plain field named in
  ``sliced``, not copied at all: each step's bytes as a slice of its chunk (consecutive steps
  of a chunk as one), a :class:`~rlreplay.app.episodes.windows.WindowSlices` that an answer
  sends where the bytes lie.

Padded steps are zeros, ``next`` at an episode's end its ``final`` (zeros without), the
stack ending there the frames before it then ``final``, exactly as a window build does.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rlreplay.app.episodes.fields import FieldSpec
from rlreplay.app.episodes.nstep import nstep_targets
from rlreplay.app.episodes.windows import (
    Alloc,
    ReadSteps,
    WindowBatch,
    WindowRequest,
    WindowSlices,
)

__all__ = ["ARENA_BYTES", "WindowGather"]

Ints = npt.NDArray[np.int64]

#: A field whose touched chunks hold at most this many bytes is gathered with one ``take``
#: over those chunks joined (a copy of them); a larger one with one ``take`` per chunk.
ARENA_BYTES = 1 << 20


def _fresh(shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    return np.empty(shape, dtype=dtype)


class WindowGather:
    """One batch of windows gathered field by field (see the module); the interface of
    :class:`~rlreplay.app.episodes.windows.WindowBuild`: :meth:`ranges`, :meth:`read` where
    the table is read, then :meth:`fill` in any thread.

    Args:
        episodes: ``[B]`` the episode (as ``read_steps`` names it) of each window.
        starts: ``[B]`` each window's first step.
        lengths: ``[B]`` the steps each episode holds (as the draw saw them).
        end_kinds: ``[B]`` how each episode ended.
        finals: each episode's ``final`` values, or None.
        request: What to return.
        schema: The table's step fields.
        chunk_steps: The table's chunk length (> 0): every read lies in one chunk.
        alloc: Makes the batch's large arrays (contents undefined: every element is written).
        sliced: Plain fields (of ``request.fields`` and ``request.next_fields``) left as
            :class:`~rlreplay.app.episodes.windows.WindowSlices` of the chunks read (what
            they read must never change: sealed chunks, and the steps an open tail holds
            already).
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
        chunk_steps: int,
        alloc: Alloc = _fresh,
        sliced: Collection[str] = (),
    ) -> None:
        if chunk_steps <= 0:
            raise ValueError(f"chunk_steps ({chunk_steps}) must be > 0")
        self._episodes = np.asarray(episodes, dtype=np.int64)
        self._starts = np.asarray(starts, dtype=np.int64)
        self._lengths = np.asarray(lengths, dtype=np.int64)
        self._end_kinds, self._finals = end_kinds, finals
        self._request, self._schema = request, schema
        self._K = chunk_steps
        columns = [f for f in request.fields if f in sliced and not request.stack(f)]
        nexts = [f for f in request.next_fields if f in sliced and not request.stack(f)]
        #: The fields left as slices, not copied: of the columns, then of ``next``.
        self.sliced = columns + nexts
        b, w = len(starts), request.window.steps
        self._t = self._starts[:, None] + np.arange(w, dtype=np.int64)[None, :]
        self.mask = self._t < self._lengths[:, None]
        self.columns: dict[str, Any] = {
            f: None if f in columns else self._array(alloc, f, b, w) for f in request.fields
        }
        self.next: dict[str, Any] = {
            f: None if f in nexts else self._array(alloc, f, b, w) for f in request.next_fields
        }
        # the distinct chunks the windows touch: key = episode * span + chunk, sorted
        self._span = int(self._lengths.max(initial=0)) // chunk_steps + 2
        self._keys, self._chunk_stops = self._chunks()
        self._ranges: list[tuple[int, int, int]] | None = None
        self._pieces: list[Mapping[str, npt.NDArray[Any]]] = []
        #: Field -> each piece's bytes, as :meth:`_slices` needed them.
        self._views: dict[str, list[memoryview | None]] = {}

    def _array(self, alloc: Alloc, name: str, b: int, w: int) -> npt.NDArray[Any]:
        spec, k = self._schema[name], self._request.stack(name)
        return alloc((b, w, *((k,) if k else ()), *spec.shape), spec.np_dtype)

    def _chunks(self) -> tuple[Ints, Ints]:
        """The sorted keys of the chunks each window's steps touch, and each one's stop
        step (its end, or its episode's length)."""
        request, K = self._request, self._K
        w, n = request.window.steps, request.window.n_step
        before = max([request.stack(f) for f in request.reads()] + [1]) - 1
        lo = np.maximum(0, self._starts - before)
        hi = np.minimum(self._lengths, self._starts + w + n)
        first, last = lo // K, (np.maximum(hi, lo + 1) - 1) // K
        width = int((last - first).max(initial=0)) + 1
        chunk = first[:, None] + np.arange(width, dtype=np.int64)[None, :]
        touched = (chunk <= last[:, None]) & (hi > lo)[:, None]
        keys = (self._episodes[:, None] * self._span + chunk)[touched]
        keys, at = np.unique(keys, return_index=True)
        window = np.nonzero(touched)[0][at]
        stops = np.minimum((keys % self._span + 1) * K, self._lengths[window])
        return keys, stops

    def ranges(self) -> list[tuple[int, int, int]]:
        """The ``(episode, lo, hi)`` of each distinct chunk the windows read: together they
        cover every window's steps (what a read-back plans from)."""
        if self._ranges is None:
            K, span = self._K, self._span
            self._ranges = [
                (key // span, key % span * K, stop)
                for key, stop in zip(self._keys.tolist(), self._chunk_stops.tolist(), strict=True)
            ]
        return self._ranges

    def read(self, read_steps: ReadSteps) -> None:
        """Reads each distinct chunk once (every field a window needs)."""
        reads = self._request.reads()
        self._pieces = [read_steps(e, lo, hi, reads) for e, lo, hi in self.ranges()]

    def fill(self) -> WindowBatch:
        """The batch: every array written from the chunks :meth:`read` took."""
        request = self._request
        w, n = request.window.steps, request.window.n_step
        b = len(self._starts)
        rows = np.repeat(np.arange(b, dtype=np.int64), w)
        valid = self.mask.ravel()
        for name, out in self.columns.items():
            if out is None:
                self.columns[name] = self._slices(name, self._t.ravel(), rows, valid)
            else:
                self._put(name, out, self._t.ravel(), rows, valid)
        if not n:
            return WindowBatch(self.columns, self.mask)
        r = w + max(n - 1, 0)
        t = self._starts[:, None] + np.arange(r, dtype=np.int64)[None, :]
        rewards = np.zeros((b, r), dtype=np.float64)
        self._put(
            request.reward_field,
            rewards,
            t.ravel(),
            np.repeat(np.arange(b, dtype=np.int64), r),
            (t < self._lengths[:, None]).ravel(),
            stack=0,
        )
        targets = nstep_targets(
            starts=self._starts,
            lengths=self._lengths,
            end_kinds=self._end_kinds,
            rewards=rewards,
            steps=w,
            n=n,
            gamma=request.gamma,
        )
        nxt = targets.next_steps
        stored = valid & (nxt < self._lengths[:, None]).ravel()
        at_end = valid & (nxt == self._lengths[:, None]).ravel()
        for name, out in self.next.items():
            if out is None:
                self.next[name] = self._slices(name, nxt.ravel(), rows, stored, at_end)
                continue
            self._put(name, out, nxt.ravel(), rows, stored)
            if at_end.any():
                self._put_finals(name, out, np.flatnonzero(at_end), w)
        return WindowBatch(self.columns, self.mask, targets, self.next)

    def _slices(
        self,
        name: str,
        steps: Ints,
        rows: Ints,
        valid: npt.NDArray[np.bool_],
        at_end: npt.NDArray[np.bool_] | None = None,
    ) -> WindowSlices:
        """Plain field ``name`` at ``steps[i]`` of window ``rows[i]``'s episode where
        ``valid[i]``, else its ``final`` where ``at_end[i]``, else zeros: as slices."""
        spec = self._schema[name]
        size = spec.step_bytes
        chunk = steps // self._K
        piece = np.searchsorted(self._keys, self._episodes[rows] * self._span + chunk)
        begin = (steps - chunk * self._K) * size
        # a run: consecutive valid steps of one chunk, sent as one slice
        follows = np.zeros(len(steps), dtype=np.bool_)
        follows[1:] = (
            valid[1:] & valid[:-1] & (piece[1:] == piece[:-1]) & (begin[1:] == begin[:-1] + size)
        )
        heads = np.flatnonzero(~follows)  # each one part: a run's first step, or a value
        stops = begin[np.append(heads[1:], len(steps))[: len(heads)] - 1] + size
        views = self._views.setdefault(name, [None] * len(self._pieces))
        for p in np.unique(piece[valid]).tolist():
            if views[p] is None:  # each chunk's bytes once (a column and next share them)
                views[p] = np.ascontiguousarray(self._pieces[p][name]).data.cast("B")
        zeros = memoryview(bytes(size))
        ends = np.zeros(len(steps), dtype=np.bool_) if at_end is None else at_end
        parts: list[memoryview] = []
        add = parts.append
        for ok, end, b, p, a, z in zip(
            valid[heads].tolist(),
            ends[heads].tolist(),
            rows[heads].tolist(),
            piece[heads].tolist(),
            begin[heads].tolist(),
            stops.tolist(),
            strict=True,
        ):
            if ok:
                add(views[p][a:z])
            elif end and (final := self._finals[b]) is not None and name in final:
                value = np.ascontiguousarray(final[name], dtype=spec.np_dtype)
                add(value.reshape(spec.shape).data.cast("B"))
            else:
                add(zeros)
        shape = (len(self._starts), self._request.window.steps, *spec.shape)
        return WindowSlices(parts, shape, spec.np_dtype)

    def _put_finals(self, name: str, out: npt.NDArray[Any], where: Ints, w: int) -> None:
        """``next`` at an episode's end: its ``final`` (the stack: the frames before it,
        then ``final``); zeros, the whole stack too, without one (as :meth:`_put` left)."""
        k = self._request.stack(name)
        flat = _rows(out, len(self._starts) * w, out.shape[2:])
        for at in where.tolist():
            b = at // w
            final = self._finals[b]
            last = None if final is None else final.get(name)
            if last is None:
                continue
            if not k:
                flat[at] = last
                continue
            length = int(self._lengths[b])
            steps = np.maximum(0, length - k + 1 + np.arange(k - 1, dtype=np.int64))
            self._put(
                name,
                flat[at, : k - 1],
                steps,
                np.full(k - 1, b, dtype=np.int64),
                np.ones(k - 1, dtype=np.bool_),
                stack=0,
            )
            flat[at, k - 1] = last

    def _put(
        self,
        name: str,
        out: npt.NDArray[Any],
        steps: Ints,
        rows: Ints,
        valid: npt.NDArray[np.bool_],
        stack: int | None = None,
    ) -> None:
        """Writes ``out``'s rows (``out`` viewed as one row per entry of ``steps``): the
        value of field ``name`` at ``steps[i]`` of window ``rows[i]``'s episode where
        ``valid[i]`` (the ``k`` frames ending there for a stacked field), zeros elsewhere."""
        k = self._request.stack(name) if stack is None else stack
        spec = self._schema.get(name)
        if spec is None:  # a table with no steps yet (a sample of no windows): nothing to read
            return
        depth = max(k, 1)
        flat = _rows(out, len(steps) * depth, spec.shape)
        if not valid.all():
            bad = np.flatnonzero(~valid)
            if depth > 1:
                bad = (bad[:, None] * depth + np.arange(depth)).ravel()
            flat[bad] = 0
            keep = np.flatnonzero(valid)
            steps, rows = steps[keep], rows[keep]
        else:
            keep = None
        if not len(steps):
            return
        if depth > 1:  # the k frames ending at each step, the first frame before step 0
            steps = np.maximum(0, steps[:, None] - (k - 1) + np.arange(k)).ravel()
            rows = np.repeat(rows, k)
            dst = None if keep is None else (keep[:, None] * depth + np.arange(depth)).ravel()
        else:
            dst = keep
        self._gather(name, spec, flat, dst, steps, rows)

    def _gather(
        self,
        name: str,
        spec: FieldSpec,
        flat: npt.NDArray[Any],
        dst: Ints | None,
        steps: Ints,
        rows: Ints,
    ) -> None:
        """``flat[dst[i]] = name[steps[i]]`` of window ``rows[i]``'s episode (``dst`` None:
        every row of ``flat`` in order)."""
        K = self._K
        chunk = steps // K
        keys = self._episodes[rows] * self._span + chunk
        piece = np.searchsorted(self._keys, keys)
        offset = steps - chunk * K
        used, inverse = np.unique(piece, return_inverse=True)
        arrays = [self._pieces[p][name] for p in used.tolist()]
        if sum(a.nbytes for a in arrays) <= ARENA_BYTES or len(arrays) == 1:
            sizes = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
            base = np.cumsum(sizes) - sizes
            arena = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            index = base[inverse.ravel()] + offset
            if dst is None and flat.dtype == arena.dtype:
                # mode "clip": the indices are in range, and "raise" would buffer the output
                np.take(arena, index, axis=0, out=flat, mode="clip")
            elif dst is None:
                flat[...] = np.take(arena, index, axis=0)
            else:
                flat[dst] = np.take(arena, index, axis=0)
            return
        if len(steps) <= 2 * len(arrays):  # a row or two per chunk: row by row, no temporaries
            targets = range(len(steps)) if dst is None else dst.tolist()
            for at, u, o in zip(targets, inverse.ravel().tolist(), offset.tolist(), strict=True):
                flat[at] = arrays[u][o]
            return
        order = np.argsort(inverse.ravel(), kind="stable")
        bounds = np.searchsorted(inverse.ravel()[order], np.arange(len(arrays) + 1))
        target = order if dst is None else dst[order]
        offset = offset[order]
        for u, array in enumerate(arrays):
            a, z = bounds[u], bounds[u + 1]
            flat[target[a:z]] = array[offset[a:z]]


def _rows(out: npt.NDArray[Any], count: int, inner: tuple[int, ...]) -> npt.NDArray[Any]:
    """``out`` as ``count`` rows of shape ``inner``: a view, never a copy (the rows are
    written through it)."""
    flat = out.view()
    flat.shape = (count, *inner)
    return flat
