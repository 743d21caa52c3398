"""The engine's windows part: sampling windows of an episode table, and their priorities.

A window sample runs in the caller's task, as an item sample does: the rate limiter counts
each window as a sample (each appended step counted as an insert when it was accepted);
every append accepted before the sample is applied first; then the eligible window starts
(:func:`~rlreplay.app.episodes.window_starts.eligible_starts`) are found, the table's
sampler picks among them (:class:`~rlreplay.app.episodes.start_sampling.StartSampler`) and
the windows are built (:class:`~rlreplay.app.episodes.windows.WindowBuild`): their steps
read on the loop, one read per chunk a window touches (views of the chunks, decompressed
through the table's chunk cache), then copied into arrays over reused buffers
(:class:`~rlreplay.app.episodes.window_buffers.WindowBuffers`), in an I/O thread when the
batch is large. The copy may run there because it touches nothing of the table: a sealed
chunk never changes, and an episode's open tail is only written past the steps it holds.

When no start is eligible (an empty table, or windows longer than every episode holds with
``pad`` false) the sample waits, as a sample of an empty item table does, up to its timeout
for appends that make one (it looks again each time the writer applies an op of the table,
never polling), then answers 504 ``deadline_exceeded`` saying so. A refused
sample consumes nothing: its draws and its rate-limiter samples are taken back.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rlreplay.app.engine.core import EngineCore
from rlreplay.app.engine.reads import Reads
from rlreplay.app.episodes.chunk_fetch import read_back
from rlreplay.app.episodes.chunk_reads import ChunkReads
from rlreplay.app.episodes.episode_table import EpisodeTable
from rlreplay.app.episodes.start_sampling import StartDraw, StartSampler
from rlreplay.app.episodes.window_buffers import WindowBuffers
from rlreplay.app.episodes.window_gather import WindowGather
from rlreplay.app.episodes.window_starts import WindowShape, eligible_starts
from rlreplay.app.episodes.windows import WindowBatch, WindowBuild, WindowRequest, answer_bytes
from rlreplay.app.tables.table import Table
from rlreplay.wire.errors import DeadlineExceeded, ValidationFailed
from rlreplay.wire.window_schemas import WindowSampleRequest

__all__ = ["WindowSample", "Windows", "window_priority"]

# The fast paths of a window build, each with its arm off for ``bench`` to compare:
#: Read a window chunk by chunk, views where the chunks lie (off: one read per window, its
#: chunks joined into a fresh array first).
READ_BY_CHUNK = True
#: Build into buffers reused across samples (off: fresh arrays, faulted in as written).
REUSE_BUFFERS = True
#: Batches of at least this many bytes are copied in an I/O thread, leaving the loop free
#: (a huge value keeps every copy on the loop).
FILL_OFF_LOOP_BYTES = 4 << 20
#: Send the plain fields of longer windows where their steps lie, slices of the chunks read
#: (:class:`~rlreplay.app.episodes.windows.WindowSlices`), rather than copying them into the
#: batch first (off: every field copied).
SLICE_WINDOWS = True
#: ...a field of at least this many bytes a step (smaller ones are copied: cheaper than
#: a slice per chunk).
SLICE_MIN_STEP_BYTES = 1024
#: Build windows of at most this many steps (n-step transitions) by one gather per field
#: over the chunks the batch touches (:class:`~rlreplay.app.episodes.window_gather.
#: WindowGather`), not window by window (0: every batch window by window). Needs
#: ``READ_BY_CHUNK``.
GATHER_MAX_STEPS = 8


@dataclass(slots=True)
class WindowSample:
    """The windows a sample drew, with each start's sampling figures."""

    episodes: list[str]
    starts: npt.NDArray[np.int64]
    batch: WindowBatch
    priorities: npt.NDArray[np.float64]
    probabilities: npt.NDArray[np.float64]
    weights: npt.NDArray[np.float64]
    times_sampled: npt.NDArray[np.int64]
    #: What the draw was proportional to over the eligible starts (the sampler's mass).
    draw_mass: float = 0.0
    #: How many starts were eligible.
    selectable: int = 0


class Windows:
    """Window samples and window priorities (the ``windows`` part of the engine)."""

    def __init__(self, core: EngineCore, reads: Reads) -> None:
        self._core = core
        self._reads = reads
        #: Each table's sampler over window starts, by table (made on its first sample).
        self._samplers: dict[int, tuple[Table, StartSampler]] = {}
        self._buffers = WindowBuffers()
        #: Batches of at least this many bytes are copied off the loop.
        self.fill_off_loop_bytes = FILL_OFF_LOOP_BYTES

    def serves(self, table: str) -> bool:
        """Whether ``table`` is an episode table (False when there is none: the item route
        answers that as it always did)."""
        state = self._core.current_state
        t = None if state is None else state.tables.get(table)
        return t is not None and t.episodes is not None

    def sampler(self, t: Table) -> StartSampler:
        """The table's sampler over window starts (ValidationFailed: one that does not apply)."""
        held = self._samplers.get(id(t))
        if held is not None and held[0] is t:
            return held[1]
        spec = t.config.sampler
        try:
            sampler = StartSampler(spec.type, spec.params)
        except ValueError as exc:
            raise ValidationFailed(str(exc)) from exc
        self._samplers = {k: v for k, v in self._samplers.items() if not v[0].dropped}
        self._samplers[id(t)] = (t, sampler)
        return sampler

    async def sample(self, table: str, params: WindowSampleRequest) -> WindowSample:
        """``params.batch_size`` windows drawn from episode table ``table``.

        Raises:
            ValidationFailed: A bad window shape or field, an answer past
                ``--max-response-mb``, a sampler that does not apply to episodes.
            DeadlineExceeded: No eligible start (or the rate limiter) within the timeout.
        """
        t = self._core.table(table)
        et = t.episodes
        if et is None:
            raise ValidationFailed(f"table {table!r} holds items, not episodes")
        try:
            shape = WindowShape(
                length=params.length,
                burn_in=params.burn_in,
                start_every=params.start_every,
                pad=params.pad,
                n_step=params.n_step or 0,
            )
        except ValueError as exc:
            raise ValidationFailed(str(exc)) from exc
        sampler = self.sampler(t)
        batch_size = params.batch_size
        timeout = params.timeout_ms / 1000
        deadline = time.monotonic() + timeout
        if not batch_size:
            return await self._figures(t, et, shape, params, sampler, deadline, timeout)
        if t.gate.limited:
            await t.gate.acquire_sample(batch_size, timeout)
        try:
            eligible, request = await self._eligible(t, et, shape, params, deadline, timeout)
            drawn = sampler.draw(
                batch_size,
                self._core.rng,
                eligible=eligible,
                priority=et.priority,
                seq=et.seq,
                times_sampled=et.times_sampled,
                max_times_sampled=t.config.max_times_sampled,
            )
            et.record_draws(drawn.slots)
            try:
                sample = await self._build(et, drawn, request)
                sample.draw_mass = sampler.mass(eligible, et.priority)
                sample.selectable = len(eligible)
            except BaseException:
                et.undo_draws(drawn.slots)
                raise
        except BaseException:
            if t.gate.limited:
                t.gate.refund_sample(batch_size)
            raise
        t.counters.samples += len(drawn.slots)
        return sample

    async def _figures(
        self,
        t: Table,
        et: EpisodeTable,
        shape: WindowShape,
        params: WindowSampleRequest,
        sampler: StartSampler,
        deadline: float,
        waited_s: float,
    ) -> WindowSample:
        """A sample of no windows: the figures of the starts the request could draw now
        (what a sharded client splits a batch by), once the appends accepted before it are
        applied; it waits for no start and draws nothing."""
        await self._reads.caught_up(t, deadline, waited_s)
        specs = et.specs
        eligible = np.zeros(0, dtype=np.int64)
        if specs is None:
            request = WindowRequest(shape, ())
        else:
            request = self._request(et, shape, params, specs)
            eligible = self._starts(t, et, shape)
        none = np.zeros(0, dtype=np.int64)
        sample = await self._build(et, StartDraw(none, np.zeros(0), np.zeros(0), 0), request)
        sample.draw_mass = sampler.mass(eligible, et.priority)
        sample.selectable = len(eligible)
        return sample

    def _starts(self, t: Table, et: EpisodeTable, shape: WindowShape) -> npt.NDArray[np.int64]:
        """The starts a window of ``shape`` may take now."""
        return eligible_starts(
            shape,
            live=et.live,
            episode_of=et.episode_of,
            step_of=et.step_of,
            length=et.length,
            end_kind=et.end_kind,
            times_sampled=et.times_sampled,
            max_times_sampled=t.config.max_times_sampled,
        )

    async def _eligible(
        self,
        t: Table,
        et: EpisodeTable,
        shape: WindowShape,
        params: WindowSampleRequest,
        deadline: float,
        waited_s: float,
    ) -> tuple[npt.NDArray[np.int64], WindowRequest]:
        """The eligible starts once there is one (and the request checked against the
        table's fields, which its first append sets)."""
        while True:
            await self._reads.caught_up(t, deadline, waited_s)
            seen = t.pending.applied_seq  # an op applied after this may make a start
            specs = et.specs
            if specs is not None:
                request = self._request(et, shape, params, specs)
                eligible = self._starts(t, et, shape)
                if len(eligible):
                    return eligible, request
            left = deadline - time.monotonic()
            if left <= 0 or not await t.pending.applied_after(seen, left):
                longest = int(et.length.max()) if len(et.length) else 0
                raise DeadlineExceeded(
                    f"table {t.name!r} had no window of {shape.steps} steps to sample within "
                    f"{waited_s:g} s (its longest episode holds {longest}"
                    + ("" if shape.pad else "; pad: true allows shorter windows")
                    + ")"
                )

    def _request(
        self, et: EpisodeTable, shape: WindowShape, params: WindowSampleRequest, specs: Any
    ) -> WindowRequest:
        """The request checked against the table's fields, and its answer's size."""
        names = tuple(params.fields) if isinstance(params.fields, list) else tuple(specs)
        request = WindowRequest(
            shape,
            names,
            et.frame_stack,
            params.gamma,
            params.reward_field,
            tuple(params.next_fields),
        )
        request.check(specs)
        one = answer_bytes(1, request, specs)
        limit = self._core.max_answer_bytes
        if one > limit:
            raise ValidationFailed(
                f"one window of {shape.steps} steps (length {shape.length} + burn_in "
                f"{shape.burn_in}) would answer {one / 2**20:.1f} MB, past the server's "
                f"--max-response-mb ({self._core.settings.max_response_mb:g})"
            )
        total = answer_bytes(params.batch_size, request, specs)
        if total > limit:
            raise self._core.too_big(total, f"a sample of {params.batch_size} windows")
        return request

    async def _build(
        self, et: EpisodeTable, drawn: StartDraw, request: WindowRequest
    ) -> WindowSample:
        """The windows of the drawn starts."""
        slots = drawn.slots
        indices = et.episode_of[slots]
        episodes = [et.episode_at(int(i)) for i in indices.tolist()]
        names = [ep.name if ep is not None else "" for ep in episodes]
        # the episodes drawn, held: reads after an await below still find them
        held = {i: ep for i, ep in zip(indices.tolist(), episodes, strict=True) if ep is not None}

        def read(index: int, start: int, stop: int, fields: Sequence[str]) -> Mapping[str, Any]:
            steps = held[index].steps
            return {f: steps.read(f, start, stop, et.cache, fetched) for f in fields}

        starts = et.step_of[slots].copy()
        schema = et.specs or {}
        parts: dict[str, Any] = {
            "episodes": indices,
            "starts": starts,
            "lengths": et.length[indices],
            "end_kinds": et.end_kind[indices],
            "finals": [ep.final if ep is not None else None for ep in episodes],
            "request": request,
            "schema": schema,
            "alloc": self._buffers if REUSE_BUFFERS else _zeros,
        }
        gather = READ_BY_CHUNK and 0 < request.window.steps <= GATHER_MAX_STEPS
        build: WindowBuild | WindowGather = (
            WindowGather(chunk_steps=et.chunk_steps, **parts, sliced=_sliced(request, schema))
            if gather
            else WindowBuild(**parts, sliced=_sliced(request, schema))
        )
        fields = request.reads()
        ranges = build.ranges()  # (episode index, lo, hi): the steps the windows read
        fetched = await read_back(  # chunks in RocksDB only: read back off the loop first
            et,
            lambda: (
                (held[index].name, lo, hi)
                for index, lo, hi in ranges
                if held[index].steps.evicted_chunks  # none evicted: nothing to read back
            ),
            fields,
            self._core.state.io.run,
        )
        reads = ChunkReads(et, held, fetched) if READ_BY_CHUNK else None
        if isinstance(build, WindowGather):
            assert reads is not None
            build.read(reads.read)
        elif reads is not None:
            build.read(reads.read, et.chunk_steps)
        else:
            build.read(read)
        sample = WindowSample(
            names,
            starts,
            WindowBatch({}, build.mask),
            et.priority[slots].copy(),
            drawn.probabilities,
            drawn.weights,
            et.times_sampled[slots].copy(),
        )
        copied = answer_bytes(len(slots), request, schema) - sum(
            len(slots) * request.window.steps * schema[f].step_bytes for f in build.sliced
        )
        deferred = reads is not None and reads.deferred > 0  # chunks to decompress
        if deferred or copied >= self.fill_off_loop_bytes:
            sample.batch = await self._core.state.io.run(build.fill)
        else:
            sample.batch = build.fill()
        if reads is not None:
            reads.keep()
        return sample


def _sliced(request: WindowRequest, schema: Mapping[str, Any]) -> tuple[str, ...]:
    """The fields a window build leaves as slices (:data:`SLICE_WINDOWS`)."""
    if not SLICE_WINDOWS:
        return ()
    return tuple(
        f
        for f in dict.fromkeys((*request.fields, *request.next_fields))
        if not request.stack(f) and schema[f].step_bytes >= SLICE_MIN_STEP_BYTES
    )


def _zeros(shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    return np.zeros(shape, dtype=dtype)


def window_priority(priority: float | None, td: Sequence[float] | None, eta: float) -> float:
    """A window start's priority: ``priority`` as given, or R2D2's mix of the window's TD
    errors, ``eta * max|td| + (1 - eta) * mean|td|``.

    Raises:
        ValidationFailed: Both or neither given, or a value that is not finite.
    """
    if (priority is None) == (td is None):
        raise ValidationFailed("a window takes either priority or td")
    if td is not None:
        errors = np.abs(np.asarray(td, dtype=np.float64))
        value = float(eta * errors.max() + (1.0 - eta) * errors.mean())
    else:
        assert priority is not None
        value = float(priority)
    if not (np.isfinite(value) and value >= 0):
        raise ValidationFailed(f"window priority ({value}) must be finite and >= 0")
    return value
