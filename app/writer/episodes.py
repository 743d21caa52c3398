"""Applying the ops of episode tables: appends, deletes, window priorities; what the
writer does to an :class:`~rlreplay.app.episodes.episode_table.EpisodeTable`.

:class:`~rlreplay.app.writer.apply.OpApplier` calls these, one op at a time, in log order
(recovery too, replaying the log). A table's ``max_size`` counts steps: past it, whole
episodes go, ended ones first (then open ones), in the order of the table's remover, never
the episode just appended to. The choice depends only on what the writer applied and on
the append's log position (which seeds the ``uniform`` remover's draw), so a replay of the
log removes the same episodes.

Held chunks and open tails count in the cache ledger (see
:mod:`~rlreplay.app.episodes.chunk_residency`): after each op the writer hands the ledger
what changed (:func:`settle_chunks`), and an eviction moves the chunks the ledger picks to
RocksDB (:func:`chunk_puts`, :func:`chunks_evicted`). Sealed chunks of a table that
compresses are compressed in a blocking-I/O thread while the writer waits (so ops keep
their order); readers meanwhile read the chunk's arrays, the same steps.

The table's change feed, once followed, gets one event per step, keyed
``<episode>@<step>`` (:func:`step_key`): a window start, which an episode table selects as
an item table selects an item. An append puts its steps with their priorities, a delete or
a trim deletes every step of the episodes removed, window priorities change theirs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import numpy as np

from rlreplay.app.episodes.chunk_residency import ChunkResidency
from rlreplay.app.episodes.episode_table import EpisodeTable
from rlreplay.app.episodes.trimming import take_excess
from rlreplay.app.tables.table import Table
from rlreplay.app.writer.ops import EpisodeAppendOp, EpisodeDeleteOp, EpisodePriorityOp, Op
from rlreplay.app.writer.state import EngineState

__all__ = [
    "apply_episode_append",
    "apply_episode_delete",
    "apply_episode_priorities",
    "chunk_puts",
    "chunks_evicted",
    "chunks_kept",
    "rebuild_accepted",
    "settle_chunks",
    "step_key",
]

log = logging.getLogger("rlreplay.app.writer.task_processor")


def _episodes(t: Table) -> EpisodeTable:
    assert t.episodes is not None, f"table {t.name!r} is not an episode table"
    return t.episodes


async def apply_episode_append(op: EpisodeAppendOp, state: EngineState) -> None:
    """Append the op's steps, compress the chunks they sealed, then trim the table to its
    ``max_size``."""
    t = op.table
    if t.dropped:
        return
    e = _episodes(t)
    applied = e.append(
        op.episode,
        op.start,
        op.steps,
        op.k,
        priorities=op.priorities,
        end=op.end,
        final=op.final,
        accepted=op.accepted,
    )
    if applied:
        t.counters.inserts += op.k
        if t.changes is not None and op.k:
            slots = e.slots_of(op.episode)[op.start : op.start + op.k]
            keys = [step_key(op.episode, op.start + i) for i in range(op.k)]
            t.changes.put(keys, e.priority[slots], time.time())
        await _compress_sealed(state, e, op.episode)
    elif op.k or op.end is not None:
        log.info(
            "table %r: an append to episode %r at step %d found it gone (removed meanwhile)",
            t.name,
            op.episode,
            op.start,
        )
    trim_episodes(t, op.seq, keep=op.episode)
    settle_chunks(state, e)
    t.pending.applied(op.seq, op.weight)
    if t.gate.limited:
        t.gate.notify()


def trim_episodes(t: Table, seq: int, *, keep: str | None = None) -> list[str]:
    """Remove whole episodes until the table fits its ``max_size`` (see the module
    docstring), after the op of log position ``seq``; returns their names."""
    e = t.episodes
    max_size = t.config.max_size
    if e is None or max_size is None or e.steps <= max_size:
        return []
    # seeded by the table and the log position, not the writer's generator: a replay of
    # the log (from a checkpoint, with a fresh generator) draws the same episodes
    rng = np.random.default_rng((t.tid, seq))
    removed = take_excess(e, max_size, t.config.remover.type, rng, keep=keep)
    t.counters.deletes += len(removed)
    if t.changes is not None:
        t.changes.delete([step_key(name, i) for name, length in removed for i in range(length)])
    return [name for name, _ in removed]


def apply_episode_delete(op: EpisodeDeleteOp, state: EngineState) -> None:
    """Delete the op's episode (a missing one is no change)."""
    t = op.table
    ep = None if t.dropped else _episodes(t).episode(op.episode)
    if not t.dropped and _episodes(t).delete(op.episode, accepted=op.accepted):
        t.counters.deletes += 1
        settle_chunks(state, _episodes(t))
        if t.changes is not None and ep is not None:
            t.changes.delete([step_key(op.episode, i) for i in range(ep.length)])
    t.pending.applied(op.seq, op.weight)
    if t.gate.limited:
        t.gate.notify()


def apply_episode_priorities(op: EpisodePriorityOp) -> None:
    """Set the op's windows' priorities (windows no longer held are skipped)."""
    t = op.table
    if not t.dropped:
        e = _episodes(t)
        e.set_window_priorities(op.windows)
        if t.changes is not None:
            held = [(n, s, p) for n, s, p in op.windows if e.slot_of(n, s) is not None]
            t.changes.priority([step_key(n, s) for n, s, _ in held], [p for _, _, p in held])
    t.pending.applied(op.seq, op.weight)


def step_key(episode: str, step: int) -> str:
    """The change feed's key of step ``step`` of episode ``episode``."""
    return f"{episode}@{step}"


def rebuild_accepted(t: Table, queued: Iterable[Op]) -> None:
    """A failed log flush refused some of ``t``'s ops: count again, in order, the appends
    and deletes still ``queued`` (see :meth:`~rlreplay.app.episodes.accepted.AcceptedOps.
    rebuild`). An append that is no longer counted (it followed a refused one) is applied as
    not accepted: it finds its episode elsewhere and changes nothing."""
    e = _episodes(t)
    ops = [
        op
        for op in queued
        if isinstance(op, EpisodeAppendOp | EpisodeDeleteOp) and op.table is t and op.accepted
    ]
    counted = e.accepted.rebuild(
        (op.episode, op.start, op.k, op.end, False)
        if isinstance(op, EpisodeAppendOp)
        else (op.episode, 0, 0, None, True)
        for op in ops
    )
    for op, kept in zip(ops, counted, strict=True):
        op.accepted = kept


async def _compress_sealed(state: EngineState, e: EpisodeTable, name: str) -> None:
    """Compress the chunks of episode ``name`` that its append sealed, off the event loop."""
    ep = e.episode(name)
    if ep is None or not ep.steps.raw:
        return
    jobs = ep.steps.to_compress()
    arrays = [a for _, fields in jobs for a in fields]
    blobs = await state.io.run(e.codec.compress, arrays)
    at = 0
    for c, fields in jobs:
        ep.steps.compressed(c, blobs[at : at + len(fields)])
        at += len(fields)
    e.recount(ep)


def settle_chunks(state: EngineState, e: EpisodeTable) -> None:
    """Hand the cache ledger the chunks ``e`` took into memory or let go since the last
    call, and what its cache of decompressed chunks holds (bounded by a quarter of the
    ledger's limit, enough for the frames a sampler keeps drawing from at the default limit;
    an eighth in memory mode, where it takes room from the steps)."""
    residency = e.residency
    share = 8 if state.storage.capped else 4
    e.cache.limit_bytes = max(1, state.ledger.limit_bytes // share)
    residency.charge_decompressed(e.cache.bytes)
    gone, slots, charges = residency.take_changes()
    if gone:
        state.ledger.discard_many(residency, gone)
    if slots:
        state.ledger.add_many(residency, slots, charges)


def chunk_puts(victims: Iterable[tuple[ChunkResidency, int]]) -> list[tuple[bytes, bytes]]:
    """What RocksDB must hold before the chunks the ledger picked leave memory."""
    puts: list[tuple[bytes, bytes]] = []
    for residency, slot in victims:
        owner = residency.owner(slot)
        if owner is not None and owner[1] >= 0:
            steps, c = owner
            puts.extend(steps.store_puts(c))
    return puts


def chunks_evicted(state: EngineState, victims: Iterable[tuple[ChunkResidency, int]]) -> int:
    """The chunks the ledger picked are in RocksDB now: they leave memory (an open tail,
    which the ledger does not pick, stays, counted). Returns the bytes freed."""
    freed = 0
    for residency, slot in victims:
        owner = residency.owner(slot)
        if owner is None:
            continue
        steps, c = owner
        if c < 0:  # pragma: no cover - its reference bit keeps it out of victims
            state.ledger.add(residency, slot, residency.charge(slot))
        else:
            freed += steps.evicted(c)
    return freed


def chunks_kept(state: EngineState, victims: Iterable[tuple[ChunkResidency, int]]) -> None:
    """An eviction failed: the chunks the ledger picked stay held, and counted."""
    for residency, slot in victims:
        if residency.owner(slot) is not None:
            state.ledger.add(residency, slot, residency.charge(slot))
