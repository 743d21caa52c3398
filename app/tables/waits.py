"""Ending a table's held waits when the server stops, its writer dies or it is deleted."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlreplay.wire.errors import ReplayError

if TYPE_CHECKING:
    from rlreplay.app.tables.table import Table

__all__ = ["end_waits"]


def end_waits(table: Table, error: ReplayError) -> None:
    """Every wait of ``table`` on other clients (claims, reservations, the rate limiter,
    samples of an empty table, change long-polls), now and later, raises ``error``."""
    table.rollouts.changed.end_waits(error)
    table.rollouts.reservations.room.end_waits(error)
    table.gate.end_waits(error)
    table.pending.end_waits(error)
    if table.changes is not None:
        table.changes.end_waits(error)
