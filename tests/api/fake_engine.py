"""A small in-memory stand-in for :class:`app.engine.engine.Engine`, for HTTP-layer tests.

It keeps the engine's interface and error behaviour (TableNotFound, TableExists,
ValidationFailed for unknown samplers, Overloaded when ``overloaded`` is set) so the routes'
mapping can be tested in isolation and without timing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from app.engine.config import TableConfig
from app.engine.items import Item, NewItem, SampledItem
from clients.errors import Overloaded, TableExists, TableNotFound, ValidationFailed

KNOWN_SAMPLERS = {"uniform", "prioritized", "fifo", "lifo", "max_heap", "min_heap", "ptime"}


class FakeEngine:
    """Tables of dicts; every op applies at once."""

    def __init__(self) -> None:
        self.tables: dict[str, tuple[TableConfig, dict[str, Item]]] = {}
        self.started = False
        self.stopped = False
        self.overloaded = False
        self.fail_with: Exception | None = None

    @property
    def ready(self) -> bool:
        return self.started and not self.stopped

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def _table(self, name: str) -> dict[str, Item]:
        if self.fail_with is not None:
            raise self.fail_with
        if name not in self.tables:
            raise TableNotFound(f"no table named {name!r}")
        return self.tables[name][1]

    async def create_table(self, name: str, config: TableConfig) -> bool:
        if config.sampler.type not in KNOWN_SAMPLERS:
            raise ValidationFailed(f"unknown sampler {config.sampler.type!r}")
        if name in self.tables:
            if self.tables[name][0] != config:
                raise TableExists(f"table {name!r} exists with another config")
            return False
        self.tables[name] = (config, {})
        return True

    async def drop_table(self, name: str) -> None:
        self._table(name)
        del self.tables[name]

    def table_names(self) -> list[str]:
        return sorted(self.tables)

    def describe(self, name: str) -> dict[str, Any]:
        items = self._table(name)
        stats = dict.fromkeys(
            ("pending_ops", "bytes_on_disk", "inserts", "samples", "deletes",
             "evictions_to_disk", "populates"), 0
        )
        stats["size"] = len(items)
        stats["bytes_in_cache"] = sum(len(i.value) for i in items.values())
        return {"name": name, "config": self.tables[name][0].to_wire(), "stats": stats}

    async def push(self, table: str, items: Sequence[NewItem], *, wait: bool = False,
                   timeout_s: float | None = None) -> int:
        stored = self._table(table)
        if self.overloaded:
            raise Overloaded("write queue full", retry_after=0.5)
        for item in items:
            stored[item.key] = Item(item.key, item.value, item.priority, time.time(), 0)
        return len(items)

    async def get(self, table: str, key: str) -> Item | None:
        return self._table(table).get(key)

    async def get_many(self, table: str, keys: Sequence[str]) -> list[Item | None]:
        stored = self._table(table)
        return [stored.get(k) for k in keys]

    async def delete(self, table: str, keys: Sequence[str], *, wait: bool = False) -> int:
        stored = self._table(table)
        if self.overloaded:
            raise Overloaded("write queue full")
        for key in keys:
            stored.pop(key, None)
        return len(keys)

    async def sample(self, table: str, batch_size: int, *, timeout_s: float | None = None,
                     include_values: bool = True) -> list[SampledItem]:
        stored = self._table(table)
        if not stored:
            from clients.errors import DeadlineExceeded

            raise DeadlineExceeded("table is empty")
        picks = random.choices(list(stored.values()), k=batch_size)
        p = 1 / len(stored)
        return [
            SampledItem(i.key, i.value if include_values else None, i.priority, p, 1.0,
                        i.times_sampled + 1)
            for i in picks
        ]

    async def update_priorities(self, table: str,
                                priorities: Mapping[str, float]) -> tuple[int, int]:
        stored = self._table(table)
        updated = 0
        for key, priority in priorities.items():
            if key in stored:
                old = stored[key]
                stored[key] = Item(key, old.value, priority, old.inserted_at, old.times_sampled)
                updated += 1
        return updated, len(priorities) - updated

    async def flush(self) -> None:
        return None

    def queue_depths(self) -> dict[str, int]:
        return {"p0": 0, "p1": 0}
