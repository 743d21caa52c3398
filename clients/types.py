"""The type aliases every client shares."""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["Item", "Layout"]

Item = dict[str, Any]
"""An item as the server answers it: ``key``, ``value``, ``priority`` and more."""
Layout = Literal["items", "columns"]
"""How reads answer: a list of items, or a :class:`~rlreplay.clients.columns.ColumnBatch`."""
