"""Applying the ops of episode tables: appends, deletes, window priorities; what the
writer does to an :class:`~rlreplay.app.episodes.episode_table.EpisodeTable`.

:class:`~rlreplay.app.writer.apply.OpApplier` calls these, one op at a time, in log order
(recovery too, replaying the log). A table's ``max_size`` counts steps: past it, whole
episodes go, ended ones first (then open ones), in the order of the table's remover, never
the episode just appended to. The choice depends only on what the writer applied and on
the append's log position (which seeds the ``uniform`` remover's draw), so a replay of the
log removes the same episodes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np

from rlreplay.app.episodes.episode_table import EpisodeTable
from rlreplay.app.tables.table import Table
from rlreplay.app.writer.ops import EpisodeAppendOp, EpisodeDeleteOp, EpisodePriorityOp, Op

__all__ = [
    "apply_episode_append",
    "apply_episode_delete",
    "apply_episode_priorities",
    "rebuild_accepted",
]

log = logging.getLogger("rlreplay.app.writer.task_processor")


def _episodes(t: Table) -> EpisodeTable:
    assert t.episodes is not None, f"table {t.name!r} is not an episode table"
    return t.episodes


def apply_episode_append(op: EpisodeAppendOp) -> None:
    """Append the op's steps (then trim the table to its ``max_size``)."""
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
    elif op.k or op.end is not None:
        log.info(
            "table %r: an append to episode %r at step %d found it gone (removed meanwhile)",
            t.name,
            op.episode,
            op.start,
        )
    trim_episodes(t, op.seq, keep=op.episode)
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
    removed = e.take_excess(max_size, t.config.remover.type, rng, keep=keep)
    t.counters.deletes += len(removed)
    return removed


def apply_episode_delete(op: EpisodeDeleteOp) -> None:
    """Delete the op's episode (a missing one is no change)."""
    t = op.table
    if not t.dropped and _episodes(t).delete(op.episode, accepted=op.accepted):
        t.counters.deletes += 1
    t.pending.applied(op.seq, op.weight)
    if t.gate.limited:
        t.gate.notify()


def apply_episode_priorities(op: EpisodePriorityOp) -> None:
    """Set the op's windows' priorities (windows no longer held are skipped)."""
    t = op.table
    if not t.dropped:
        _episodes(t).set_window_priorities(op.windows)
    t.pending.applied(op.seq, op.weight)


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
