"""The appends and deletes of an episode table accepted and not applied yet.

Admission numbers an append by the steps its episode will hold once every op accepted
before it is applied: this is that count, per episode with ops in flight, over the applied
state (which the :class:`~rlreplay.app.episodes.episode_table.EpisodeTable` gives). An entry
goes once its episode's last op in flight is applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rlreplay.wire.errors import StepConflict

__all__ = ["AcceptedOps"]


class AcceptedOps:
    """Per episode with ops in flight: its length and whether it ended once they are
    applied. ``applied(name)`` gives ``(length, ended)`` of the applied state."""

    def __init__(self, applied: Callable[[str], tuple[int, bool]]) -> None:
        self._applied = applied
        self._entries: dict[str, list[int]] = {}  # name → [length, ended, ops in flight]
        #: Steps the ops in flight add (deletes take theirs away).
        self.steps = 0

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def view(self, name: str) -> tuple[int, bool]:
        """(steps, ended) of episode ``name`` once every accepted op is applied."""
        entry = self._entries.get(name)
        if entry is not None:
            return entry[0], bool(entry[1])
        return self._applied(name)

    def admit_append(self, name: str, start: int, k: int, end: str | None) -> bool:
        """Admit an append of ``k`` steps at ``start`` (ending the episode with ``end``):
        True when it is new (and now counted); False when it may be a retry of steps
        already accepted (to compare with them once they are applied).

        Raises:
            StepConflict: ``start`` is neither the episode's length nor a retry's, or the
                episode has ended.
        """
        length, ended = self.view(name)
        if start == length and not ended:
            entry = self._entries.setdefault(name, [length, 0, 0])
            entry[0] += k
            entry[1] = int(end is not None)
            entry[2] += 1
            self.steps += k
            return True
        if start + k <= length and (start < length or end is not None):
            return False
        state = "has ended" if ended else "is open"
        raise StepConflict(
            f"episode {name!r} holds {length} steps and {state}: "
            + (
                "nothing can be appended to it"
                if ended
                else f"an append must start at {length}, not {start}"
            )
        )

    def admit_delete(self, name: str) -> None:
        """Admit a delete of episode ``name``: appends after it start a new one at 0."""
        length, _ = self.view(name)
        entry = self._entries.setdefault(name, [length, 0, 0])
        self.steps -= entry[0]
        entry[0], entry[1] = 0, 0
        entry[2] += 1

    def settle(self, name: str, k: int) -> None:
        """An accepted op of ``name`` (``k`` steps) was applied, or found void."""
        entry = self._entries.get(name)
        if entry is None:
            return
        self.steps -= k
        entry[2] -= 1
        if entry[2] <= 0:
            del self._entries[name]

    def rebuild(self, ops: Iterable[tuple[str, int, int, str | None, bool]]) -> list[bool]:
        """Count again, over the applied state, the accepted ops still queued: ``(name,
        start, k, end, is_delete)`` each, in order (after a failed log flush refused some).
        Returns, for each, whether it is counted: an append whose ``start`` a refused op was
        to reach is not (applied, it finds its episode elsewhere and changes nothing), and
        must not be settled when applied."""
        self._entries.clear()
        self.steps = 0
        counted = []
        for name, start, k, end, is_delete in ops:
            if is_delete:
                self.admit_delete(name)
                counted.append(True)
            elif self.view(name) == (start, False):
                self.admit_append(name, start, k, end)
                counted.append(True)
            else:
                counted.append(False)
        return counted
