"""A table's selection state in device memory: keys ↔ slots, priorities, insertion times.

The keys stay on the host (a dict and a list: a key is a string, and a device cannot hash
one); everything selection reads is a tensor on the device, one element per slot. Events
from the server's change feed are resolved to slots on the host, their effects folded so
that each slot is written once, and written with one scatter per column per batch: a slot
that several events of a batch touch ends as the last one left it, the same as applying
them one by one. Freed slots are reused; the tensors double when they fill up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["DeviceIndex"]

_MIN_CAPACITY = 1024


class DeviceIndex:
    """Keys ↔ slots on the host; ``priority``, ``inserted_at``, ``order`` and ``live`` per
    slot on ``device``.

    ``order`` is an insertion counter (a put, new or replacing, takes the next number), so
    FIFO and LIFO follow the server's insertion order. ``version`` grows with every change,
    which lets selection cache what it derives from the columns (prefix sums).
    """

    def __init__(self, device: torch.device | str = "cpu", capacity: int = _MIN_CAPACITY) -> None:
        """An empty index of ``capacity`` slots on ``device``."""
        self.device = torch.device(device)
        self.capacity = 0
        self.slot_of: dict[str, int] = {}
        self.keys: list[str | None] = []
        self._free: list[int] = []
        self.next_order = 0
        self.version = 0
        # (version, slots that version wrote): lets selection refresh only what changed
        self._log: list[tuple[int, torch.Tensor]] = []
        self._logged = 0
        self._log_floor = 0  # changes before this version are not in the log
        self.priority = torch.zeros(0, dtype=torch.float64, device=self.device)
        self.inserted_at = torch.zeros(0, dtype=torch.float64, device=self.device)
        self.order = torch.zeros(0, dtype=torch.int64, device=self.device)
        self.live = torch.zeros(0, dtype=torch.bool, device=self.device)
        self._grow(max(_MIN_CAPACITY, capacity))

    def __len__(self) -> int:
        """Items held."""
        return len(self.slot_of)

    @property
    def used(self) -> int:
        """Slots handed out so far (live or free): selection looks at these only."""
        return len(self.keys)

    def _grow(self, capacity: int) -> None:
        """Doubles (at least) the columns, keeping their contents."""
        new = max(capacity, 2 * self.capacity)

        def grown(old: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(new, dtype=old.dtype, device=self.device)
            out[: len(old)] = old
            return out

        self.priority = grown(self.priority)
        self.inserted_at = grown(self.inserted_at)
        self.order = grown(self.order)
        self.live = grown(self.live)
        self.capacity = new
        self._forget_log()

    def _forget_log(self) -> None:
        self.version += 1
        self._log.clear()
        self._logged = 0
        self._log_floor = self.version

    def changed_since(self, version: int) -> torch.Tensor | None:
        """The slots written after ``version`` (with repeats), or None when that is not
        known (the index was reloaded or grew since, or the log was trimmed)."""
        if version < self._log_floor:
            return None
        parts = [slots for v, slots in self._log if v > version]
        if not parts:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        return torch.cat(parts)

    def _slot_for(self, key: str) -> int:
        slot = self.slot_of.get(key)
        if slot is not None:
            return slot
        if self._free:
            slot = self._free.pop()
            self.keys[slot] = key
        else:
            slot = len(self.keys)
            self.keys.append(key)
        self.slot_of[key] = slot
        return slot

    def clear(self) -> None:
        """Forget every item (before a reload)."""
        self.slot_of.clear()
        self.keys.clear()
        self._free.clear()
        self.next_order = 0
        self.live.zero_()
        self._forget_log()

    def load(self, keys: Sequence[str], priorities: Any, inserted_at: Any) -> None:
        """Replace the whole state with these items, oldest insert first (``/index``)."""
        self.clear()
        n = len(keys)
        if n > self.capacity:
            self._grow(n)
        self.keys.extend(keys)
        self.slot_of.update(zip(keys, range(n), strict=True))
        prios = torch.as_tensor(np.asarray(priorities, dtype=np.float64))
        times = torch.as_tensor(np.asarray(inserted_at, dtype=np.float64))
        self.priority[:n] = prios.to(self.device, non_blocking=True)
        self.inserted_at[:n] = times.to(self.device, non_blocking=True)
        self.order[:n] = torch.arange(n, dtype=torch.int64, device=self.device)
        self.live[:n] = True
        self.next_order = n
        self._forget_log()

    def apply(self, events: Iterable[Mapping[str, Any]]) -> int:
        """Apply change-feed events in order; one scatter per column. Returns how many.

        Each event is ``{"op": "put" | "delete" | "priority", "key", "priority",
        "inserted_at"}`` as the server's ``/changes`` answers it.
        """
        # slot -> (live, priority, inserted_at, order) as the batch leaves it; order -1:
        # unchanged by a put (a priority update keeps the old insertion time and order)
        final: dict[int, tuple[bool, float, float, int]] = {}
        freed: list[int] = []
        count = 0
        slot_of = self.slot_of
        for event in events:
            count += 1
            op, key = event["op"], event["key"]
            if op == "put":
                slot = self._slot_for(key)
                final[slot] = (True, event["priority"], event["inserted_at"], self.next_order)
                self.next_order += 1
            elif op == "delete":
                slot = slot_of.pop(key, -1)
                if slot >= 0:
                    self.keys[slot] = None
                    freed.append(slot)  # reused by a later batch, once written dead
                    final[slot] = (False, 0.0, 0.0, -1)
            else:
                slot = slot_of.get(key, -1)
                if slot >= 0:
                    was = final.get(slot)
                    if was is None:
                        final[slot] = (True, event["priority"], float("nan"), -1)
                    else:
                        final[slot] = (True, event["priority"], was[2], was[3])
        if final:
            self._write(final)
        self._free.extend(s for s in freed if self.keys[s] is None)
        return count

    def _write(self, final: dict[int, tuple[bool, float, float, int]]) -> None:
        """Writes the folded batch with one scatter per column."""
        if self.used > self.capacity:
            self._grow(self.used)
        slots = np.fromiter(final.keys(), dtype=np.int64, count=len(final))
        rows = list(final.values())
        live = np.fromiter((r[0] for r in rows), dtype=np.bool_, count=len(rows))
        prio = np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows))
        times = np.fromiter((r[2] for r in rows), dtype=np.float64, count=len(rows))
        order = np.fromiter((r[3] for r in rows), dtype=np.int64, count=len(rows))
        dev = self.device
        idx = torch.from_numpy(slots).to(dev, non_blocking=True)
        self.live[idx] = torch.from_numpy(live).to(dev, non_blocking=True)
        self.priority[idx] = torch.from_numpy(prio).to(dev, non_blocking=True)
        # a priority update leaves the insertion time and order as they were
        put = order >= 0
        if put.any():
            at = torch.from_numpy(slots[put]).to(dev, non_blocking=True)
            self.inserted_at[at] = torch.from_numpy(times[put]).to(dev, non_blocking=True)
            self.order[at] = torch.from_numpy(order[put]).to(dev, non_blocking=True)
        self._logged_write(idx)

    def set_priorities(self, slots: torch.Tensor, priorities: torch.Tensor) -> None:
        """New priorities at distinct, live ``slots`` given on the device (one scatter),
        as a batch of ``priority`` events would set them."""
        self.priority[slots] = priorities
        self._logged_write(slots)

    def _logged_write(self, idx: torch.Tensor) -> None:
        self.version += 1
        self._log.append((self.version, idx))
        self._logged += len(idx)
        if self._logged > max(1 << 16, self.capacity // 8):  # cheaper to rebuild by then
            self._log.clear()
            self._logged = 0
            self._log_floor = self.version

    def keys_of(self, slots: torch.Tensor) -> list[str]:
        """The keys at ``slots`` (one host copy of the slots)."""
        keys = self.keys
        return [keys[s] or "" for s in slots.cpu().tolist()]
