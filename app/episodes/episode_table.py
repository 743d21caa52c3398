"""An episode table's steps and their columns: the one object that changes them.

An episode is a name (1 to 512 bytes of UTF-8) and its steps, numbered from 0; it is open
until an append ends it ``terminated`` or ``truncated``, with optional ``final`` values (the
fields after its last step). Its steps are stored column by column in chunks
(:class:`~rlreplay.app.episodes.episode_steps.EpisodeSteps`).

Every step has a *slot*, and the per-step columns are indexed by it: ``episode_of`` (the
episode's index), ``step_of`` (the step's number in its episode), ``priority`` (that of the
window starting at the step), ``seq`` (append order across the table), ``times_sampled`` and
``live``. Every episode has an *index* (reused once it is deleted), and the per-episode
columns are indexed by it: ``length`` and ``end_kind`` (:data:`OPEN`, :data:`TERMINATED`,
:data:`TRUNCATED`). Window eligibility and sampling read these columns; the properties hand
out read-only views, valid until the next change of the table.

Who calls what (everything runs on the event loop's thread):

* Admission, in the caller's task: :meth:`check_steps` (learns the fields from the table's
  first append), :attr:`accepted` (the ops accepted and not applied yet:
  :class:`~rlreplay.app.episodes.accepted.AcceptedOps`), :meth:`is_retry` (after the
  table's accepted ops are applied).
* The writer, in log order: :meth:`append`, :meth:`delete` (and
  :func:`~rlreplay.app.episodes.trimming.take_excess` through it),
  :meth:`set_priorities`, :meth:`load_state_dict`, :meth:`load_episode`.
* A sample, once every op accepted before it is applied: :meth:`record_draws`.
* Any reader: :meth:`read`, :meth:`episode`, the columns, :meth:`slot_of`, :meth:`slots_of`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.app.episodes.accepted import AcceptedOps
from rlreplay.app.episodes.chunk_cache import ChunkCache
from rlreplay.app.episodes.chunk_residency import ChunkResidency
from rlreplay.app.episodes.episode import (
    END_KINDS,
    MIN_CHUNK_STEPS,
    OPEN,
    TERMINATED,
    TRUNCATED,
    Episode,
    chunk_steps_for,
    end_name,
)
from rlreplay.app.episodes.episode import grown as _grown
from rlreplay.app.episodes.episode_steps import ChunkCodec, EpisodeSteps
from rlreplay.app.episodes.fields import (
    FieldSpec,
    check_final,
    check_steps,
    learn_fields,
    specs_from_state,
    specs_state,
)
from rlreplay.wire.errors import ValidationFailed

__all__ = [
    "END_KINDS",
    "OPEN",
    "TERMINATED",
    "TRUNCATED",
    "Episode",
    "EpisodeTable",
    "chunk_steps_for",
    "end_name",
]


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


class EpisodeTable:
    """An episode table's episodes, steps and columns (see the module docstring).

    Args:
        compression: ``"zstd"`` or ``"none"``: how sealed chunks are stored.
        frame_stack: Field → k of the fields sampled as stacks of frames (stacks are
            assembled when read; each frame is stored once).
        chunk_cache_bytes: The bound of the cache of decompressed chunks.
    """

    def __init__(
        self,
        *,
        compression: str = "none",
        frame_stack: Mapping[str, int] | None = None,
        chunk_cache_bytes: int = 64 * 2**20,
    ) -> None:
        self.codec = ChunkCodec(compression)
        self.frame_stack: dict[str, int] = dict(frame_stack or {})
        self.cache = ChunkCache(chunk_cache_bytes)
        #: Its held chunks, as the cache ledger's entries.
        self.residency = ChunkResidency()
        self._specs: dict[str, FieldSpec] | None = None
        self._chunk_steps = MIN_CHUNK_STEPS
        self._by_name: dict[str, Episode] = {}
        self._by_index: list[Episode | None] = []
        self._free_indices: list[int] = []
        self._free_slots: list[int] = []
        self._top = 0  # slots ever used: the columns' valid prefix
        self._steps = 0
        self._next_seq = 0
        self._next_created = 0
        self._stored_bytes = 0
        self._episode_bytes: dict[int, int] = {}  # index → its steps' stored bytes
        cap = 0
        self._episode_of = np.zeros(cap, dtype=np.int64)
        self._step_of = np.zeros(cap, dtype=np.int64)
        self._priority = np.zeros(cap, dtype=np.float64)
        self._seq = np.zeros(cap, dtype=np.int64)
        self._times_sampled = np.zeros(cap, dtype=np.int64)
        self._live = np.zeros(cap, dtype=np.bool_)
        self._length = np.zeros(cap, dtype=np.int64)
        self._end_kind = np.zeros(cap, dtype=np.int8)
        self._max_priority: float | None = None  # None: to be found again
        #: The appends and deletes accepted and not applied yet (admission's).
        self.accepted = AcceptedOps(self._applied_view)
        #: Deleted episodes RocksDB holds: (name, number, chunks per field it may hold).
        self._gone: list[tuple[str, int, int]] = []
        #: Episode index → the change clock at its last change (see :meth:`changed`).
        self._changed_at = np.zeros(cap, dtype=np.int64)
        self._clock, self._written = 1, 0

    # -- columns, read-only ------------------------------------------------------------------

    @property
    def top(self) -> int:
        """Slots in use or freed so far: the per-step columns' valid length."""
        return self._top

    @property
    def episode_of(self) -> np.ndarray:
        """Slot → the index of its step's episode (valid where :attr:`live`)."""
        return _read_only(self._episode_of[: self._top])

    @property
    def step_of(self) -> np.ndarray:
        """Slot → its step's number within its episode."""
        return _read_only(self._step_of[: self._top])

    @property
    def priority(self) -> np.ndarray:
        """Slot → the priority of the window starting at its step."""
        return _read_only(self._priority[: self._top])

    @property
    def seq(self) -> np.ndarray:
        """Slot → its step's place in the table's append order."""
        return _read_only(self._seq[: self._top])

    @property
    def times_sampled(self) -> np.ndarray:
        """Slot → how many drawn windows started at its step."""
        return _read_only(self._times_sampled[: self._top])

    @property
    def live(self) -> np.ndarray:
        """Slot → whether it holds a step (False: free)."""
        return _read_only(self._live[: self._top])

    @property
    def length(self) -> np.ndarray:
        """Episode index → its number of steps (0 for a free index)."""
        return _read_only(self._length[: len(self._by_index)])

    @property
    def end_kind(self) -> np.ndarray:
        """Episode index → :data:`OPEN`, :data:`TERMINATED` or :data:`TRUNCATED`."""
        return _read_only(self._end_kind[: len(self._by_index)])

    # -- what it holds -----------------------------------------------------------------------

    @property
    def specs(self) -> Mapping[str, FieldSpec] | None:
        """The step fields, once learned from the first append."""
        return self._specs

    @property
    def chunk_steps(self) -> int:
        """Steps per chunk."""
        return self._chunk_steps

    @property
    def episodes(self) -> int:
        """Episodes held (applied)."""
        return len(self._by_name)

    @property
    def steps(self) -> int:
        """Steps held (applied)."""
        return self._steps

    @property
    def accepted_steps(self) -> int:
        """Steps held once every accepted append and delete is applied (what rate limiters
        and readers count)."""
        return self._steps + self.accepted.steps

    @property
    def stored_bytes(self) -> int:
        """Bytes of the stored steps (sealed chunks as stored, compressed or not; open tails
        as their raw steps) and final values."""
        return self._stored_bytes

    @property
    def names(self) -> Iterable[str]:
        """The episodes' names."""
        return self._by_name.keys()

    def episode(self, name: str) -> Episode | None:
        """The episode named ``name`` (applied), or None."""
        return self._by_name.get(name)

    def episode_at(self, index: int) -> Episode | None:
        """The episode of index ``index``, or None."""
        return self._by_index[index] if 0 <= index < len(self._by_index) else None

    def slot_of(self, name: str, step: int) -> int | None:
        """The slot of step ``step`` of episode ``name``, or None."""
        ep = self._by_name.get(name)
        if ep is None or not 0 <= step < ep.length:
            return None
        return int(ep.slots[step])

    def slots_of(self, name: str) -> np.ndarray:
        """The slots of episode ``name``'s steps, in order (empty when it is missing)."""
        ep = self._by_name.get(name)
        if ep is None:
            return np.zeros(0, dtype=np.int64)
        return _read_only(ep.slots[: ep.length])

    @property
    def max_priority(self) -> float:
        """The largest priority of a step held; 1.0 when none is."""
        if self._max_priority is None:
            live = self._live[: self._top]
            self._max_priority = (
                float(self._priority[: self._top][live].max()) if live.any() else 1.0
            )
        return self._max_priority

    def read(
        self,
        name: str,
        start: int,
        stop: int,
        fields: Sequence[str] | None = None,
        *,
        fetched: Mapping[tuple[int, str, int], np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Steps ``[start, stop)`` of episode ``name``, each field's array (``fields``: those
        alone); the arrays may be read-only views of what is stored. ``fetched``: evicted
        chunks read back already (:mod:`~rlreplay.app.episodes.chunk_fetch`).

        Raises:
            KeyError: No such episode.
            ValueError: The range is not within its steps.
        """
        ep = self._by_name[name]
        if not 0 <= start <= stop <= ep.length:
            raise ValueError(f"steps [{start}, {stop}) are not within [0, {ep.length})")
        specs = self._specs or {}
        names = specs if fields is None else fields
        return {f: ep.steps.read(f, start, stop, self.cache, fetched) for f in names}

    # -- admission ---------------------------------------------------------------------------

    def check_steps(
        self, steps: Mapping[str, np.ndarray], dtypes: Mapping[str, str] | None = None
    ) -> int:
        """The number of steps in an append's ``steps``, checked against the table's fields
        (learned here from the table's first append that has any).

        Raises:
            ValidationFailed: As :func:`~rlreplay.app.episodes.fields.check_steps`.
        """
        dtypes = dtypes or {}
        if self._specs is None:
            if not steps:
                return 0
            specs = learn_fields(steps, dtypes)
            k = check_steps(specs, steps, dtypes)
            self._learn(specs)
            return k
        if not steps:
            return 0
        return check_steps(self._specs, steps, dtypes)

    def check_final(self, final: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """An end's ``final`` values as arrays of their fields (ValidationFailed if not)."""
        if self._specs is None:
            if final:
                raise ValidationFailed("end.final: the table has no steps yet to know fields by")
            return {}
        return check_final(self._specs, final)

    def _learn(self, specs: dict[str, FieldSpec]) -> None:
        self._specs = specs
        self._chunk_steps = chunk_steps_for(sum(s.step_bytes for s in specs.values()))

    def _applied_view(self, name: str) -> tuple[int, bool]:
        ep = self._by_name.get(name)
        return (0, False) if ep is None else (ep.length, ep.end is not None)

    def is_retry(
        self, name: str, start: int, steps: Mapping[str, np.ndarray], k: int, end: str | None
    ) -> bool:
        """Whether an append is a retry of steps stored (applied) with the same bytes, and,
        with ``end``, of the same end."""
        ep = self._by_name.get(name)
        if ep is None or start + k > ep.length or (end is not None and ep.end != end):
            return False
        stored = self.read(name, start, start + k, list(steps))
        for f, array in steps.items():
            mine = np.ascontiguousarray(stored[f])
            if mine.tobytes() != np.ascontiguousarray(array).tobytes():
                return False
        return True

    # -- the writer's ------------------------------------------------------------------------

    def append(
        self,
        name: str,
        start: int,
        steps: Mapping[str, np.ndarray],
        k: int,
        *,
        priorities: Sequence[float] | None = None,
        end: str | None = None,
        final: Mapping[str, np.ndarray] | None = None,
        accepted: bool = True,
    ) -> bool:
        """Append ``k`` steps at ``start`` (checked by :meth:`check_steps`), ending the
        episode with ``end``; False when the episode is no longer at ``start`` (deleted or
        trimmed meanwhile) and nothing changed. ``accepted``: it was counted by
        :attr:`accepted` (False when the log is replayed)."""
        if accepted:
            self.accepted.settle(name, k)
        ep = self._by_name.get(name)
        length = 0 if ep is None else ep.length
        if start != length or (ep is not None and ep.end is not None):
            return False
        if k and self._specs is None:
            self.check_steps(steps)
        if ep is None:
            ep = self._new_episode(name)
        if k:
            self._add_steps(ep, steps, k, priorities)
        if end is not None:
            ep.end = end
            self._end_kind[ep.index] = END_KINDS[end]
            ep.steps.seal()
            if final:
                ep.final = dict(final)
                ep.final_bytes = sum(a.nbytes for a in final.values())
            self._stored_bytes += ep.final_bytes
        self.recount(ep)
        self._changed_at[ep.index] = self._clock
        return True

    def recount(self, ep: Episode) -> None:
        """Take the stored bytes of ``ep``'s steps again (after an append or once its
        sealed chunks are compressed)."""
        self._stored_bytes += ep.steps.stored_bytes - self._episode_bytes.get(ep.index, 0)
        self._episode_bytes[ep.index] = ep.steps.stored_bytes

    def _new_episode(self, name: str, created: int | None = None) -> Episode:
        specs = self._specs or {}
        index = self._free_indices.pop() if self._free_indices else len(self._by_index)
        created = self._next_created if created is None else created
        self._next_created = max(self._next_created, created + 1)
        steps = EpisodeSteps(specs, self._chunk_steps, self.codec, self.residency, created)
        ep = Episode(name, index, steps, np.zeros(8, dtype=np.int64), created)
        if index == len(self._by_index):
            self._by_index.append(ep)
            if index >= len(self._length):
                cap = max(16, 2 * len(self._length))
                self._length = _grown(self._length, cap)
                self._end_kind = _grown(self._end_kind, cap)
                self._changed_at = _grown(self._changed_at, cap)
        else:
            self._by_index[index] = ep
        self._length[index] = 0
        self._end_kind[index] = OPEN
        self._by_name[name] = ep
        return ep

    def _add_steps(
        self,
        ep: Episode,
        steps: Mapping[str, np.ndarray],
        k: int,
        priorities: Sequence[float] | None,
    ) -> None:
        slots = self._alloc_slots(k)
        start = ep.length
        if len(ep.slots) < start + k:
            ep.slots = _grown(ep.slots, max(2 * len(ep.slots), start + k))
        ep.slots[start : start + k] = slots
        self._episode_of[slots] = ep.index
        self._step_of[slots] = np.arange(start, start + k)
        if priorities is None:
            prios = np.full(k, self.max_priority)
        else:
            prios = np.asarray(priorities, dtype=np.float64)
            if k and self._max_priority is not None:
                self._max_priority = max(self._max_priority, float(prios.max()))
        self._priority[slots] = prios
        self._seq[slots] = np.arange(self._next_seq, self._next_seq + k)
        self._next_seq += k
        self._times_sampled[slots] = 0
        self._live[slots] = True
        ep.steps.append(steps, k)
        self._length[ep.index] = ep.length
        self._steps += k

    def _alloc_slots(self, k: int) -> np.ndarray:
        reused = self._free_slots[-k:] if k <= len(self._free_slots) else list(self._free_slots)
        del self._free_slots[len(self._free_slots) - len(reused) :]
        fresh = k - len(reused)
        if self._top + fresh > len(self._live):
            cap = max(64, 2 * len(self._live), self._top + fresh)
            self._episode_of = _grown(self._episode_of, cap)
            self._step_of = _grown(self._step_of, cap)
            self._priority = _grown(self._priority, cap)
            self._seq = _grown(self._seq, cap)
            self._times_sampled = _grown(self._times_sampled, cap)
            self._live = _grown(self._live, cap)
        out = np.empty(k, dtype=np.int64)
        out[: len(reused)] = reused
        out[len(reused) :] = np.arange(self._top, self._top + fresh)
        self._top += fresh
        return out

    def delete(self, name: str, *, accepted: bool = True) -> bool:
        """Remove episode ``name`` and its steps; False when it was not there.
        ``accepted``: it was counted by :attr:`accepted`."""
        if accepted:
            self.accepted.settle(name, 0)
        ep = self._by_name.pop(name, None)
        if ep is None:
            return False
        if ep.persisted >= 0 or ep.steps.in_store:
            self._gone.append((ep.name, ep.created, ep.steps.sealed_chunks))
        ep.steps.release()
        slots = ep.slots[: ep.length]
        self._live[slots] = False
        self._free_slots.extend(slots.tolist())
        self._steps -= ep.length
        self._stored_bytes -= self._episode_bytes.pop(ep.index, 0) + ep.final_bytes
        self._by_index[ep.index] = None
        self._length[ep.index] = 0
        self._end_kind[ep.index] = OPEN
        self._free_indices.append(ep.index)
        self._max_priority = None
        return True

    def set_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of live ``slots`` (the windows starting at their steps)."""
        self._priority[slots] = priorities
        self._max_priority = None
        self._changed_at[self._episode_of[slots]] = self._clock

    def set_window_priorities(self, windows: Iterable[tuple[str, int, float]]) -> tuple[int, int]:
        """Set the priority of each ``(episode, start, priority)``; returns (updated,
        missing)."""
        slots, values, missing = [], [], 0
        for name, start, p in windows:
            slot = self.slot_of(name, start)
            if slot is None:
                missing += 1
            else:
                slots.append(slot)
                values.append(p)
        if slots:
            self.set_priorities(np.asarray(slots, np.int64), np.asarray(values, np.float64))
        return len(slots), missing

    # -- a sample's ----------------------------------------------------------------------

    def record_draws(self, slots: np.ndarray) -> None:
        """Count a drawn window at each of ``slots`` (repeats count again)."""
        np.add.at(self._times_sampled, slots, 1)
        self._changed_at[self._episode_of[slots]] = self._clock

    def undo_draws(self, slots: np.ndarray) -> None:
        """Take back :meth:`record_draws` of ``slots`` (an answer that was refused)."""
        np.subtract.at(self._times_sampled, slots, 1)

    # -- persistence ---------------------------------------------------------------------

    def take_gone(self) -> list[tuple[str, int, int]]:
        """The deleted episodes RocksDB holds, handed over to a checkpoint (which keeps
        their deletes for the next one if it fails)."""
        gone, self._gone = self._gone, []
        return gone

    def episodes_held(self) -> list[Episode]:
        """The episodes, oldest first."""
        return sorted(self._by_name.values(), key=lambda ep: ep.created)

    def changed(self) -> tuple[list[Episode], int]:
        """The episodes changed since the last :meth:`written` (appended to, priorities
        set, sampled), oldest first, and the clock to hand :meth:`written` once their
        records are stored; changes from now on count for the next call."""
        top = len(self._by_index)
        since, upto = self._written, self._clock
        self._clock += 1
        at = np.flatnonzero(self._changed_at[:top] > since).tolist()
        eps = [ep for i in at if (ep := self._by_index[i]) is not None]
        return sorted(eps, key=lambda ep: ep.created), upto

    def written(self, upto: int) -> None:
        """The records of the episodes :meth:`changed` gave (with clock ``upto``) are
        stored."""
        self._written = max(self._written, upto)

    def state_dict(self) -> dict[str, Any]:
        """The table's own state beyond its episodes."""
        return {
            "specs": None if self._specs is None else specs_state(self._specs),
            "chunk_steps": self._chunk_steps,
            "next_seq": self._next_seq,
            "next_created": self._next_created,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back :meth:`state_dict` (before any episode is loaded)."""
        if state.get("specs") is not None:
            self._specs = specs_from_state(state["specs"])
        self._chunk_steps = int(state.get("chunk_steps", self._chunk_steps))
        self._next_seq = int(state.get("next_seq", 0))
        self._next_created = int(state.get("next_created", 0))

    def episode_state(self, ep: Episode) -> dict[str, Any]:
        """An episode's record: everything but its sealed chunks (see
        :meth:`~rlreplay.app.episodes.episode_steps.EpisodeSteps.chunks_of`), whose count
        per field it gives as ``chunks``."""
        slots = ep.slots[: ep.length]
        return {
            "name": ep.name,
            "created": ep.created,
            "length": ep.length,
            "end": ep.end,
            "final": None if ep.final is None else {f: a.tobytes() for f, a in ep.final.items()},
            "priority": self._priority[slots].tobytes(),
            "seq": self._seq[slots].tobytes(),
            "times_sampled": self._times_sampled[slots].tobytes(),
            "chunks": ep.steps.sealed_chunks,
            "tail": ep.steps.tail_state(),
        }

    def load_episode(
        self, record: Mapping[str, Any], chunks: Mapping[str, Sequence[bytes | int]]
    ) -> None:
        """Bring back an episode from :meth:`episode_state` and its sealed chunks (each
        one's bytes, or its size when it stays in RocksDB)."""
        name, length = record["name"], int(record["length"])
        ep = self._new_episode(name, int(record["created"]))
        specs = self._specs or {}
        ep.steps.load(chunks, record.get("tail") or {}, length)
        slots = self._alloc_slots(length)
        ep.slots = _grown(ep.slots, max(len(ep.slots), length))
        ep.slots[:length] = slots
        self._episode_of[slots] = ep.index
        self._step_of[slots] = np.arange(length)
        self._priority[slots] = np.frombuffer(record["priority"], np.float64)
        self._seq[slots] = np.frombuffer(record["seq"], np.int64)
        self._times_sampled[slots] = np.frombuffer(record["times_sampled"], np.int64)
        self._live[slots] = True
        self._length[ep.index] = length
        self._steps += length
        if record.get("end") is not None:
            ep.end = str(record["end"])
            self._end_kind[ep.index] = END_KINDS[ep.end]
        if record.get("final") is not None:
            ep.final = {
                f: np.frombuffer(raw, specs[f].np_dtype).reshape(specs[f].shape)
                for f, raw in record["final"].items()
            }
            ep.final_bytes = sum(a.nbytes for a in ep.final.values())
        self._episode_bytes[ep.index] = ep.steps.stored_bytes
        self._stored_bytes += ep.steps.stored_bytes + ep.final_bytes
        self._max_priority = None
