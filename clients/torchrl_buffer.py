"""A TorchRL-style replay buffer whose storage and sampler are an rlreplay table.

:class:`TableReplayBuffer` speaks the calls TorchRL code makes of a
``TensorDictReplayBuffer`` or ``TensorDictPrioritizedReplayBuffer``: ``extend`` and ``add``
with TensorDicts, ``sample`` answering a TensorDict with ``index`` and the importance
weights (as ``priority_weight``, which TorchRL's losses read, and ``_weight``, its older
name), ``update_priority``, ``update_tensordict_priority``, ``len``, ``write_count``,
``empty`` and ``state_dict``/``load_state_dict`` of what the buffer itself holds. The
items live on the server, so many collectors may extend one table and many learners
sample it.

TorchRL's index is an integer position in local storage; here it names an item. Each
buffer writes keys ``td:<index>`` where ``index`` is ``writer_id << 40 | n`` (``n`` counts
the buffer's writes), so an index from any writer's item maps back to its key, and an
index is never reused (TorchRL's round-robin writer reuses positions; the table's
``max_size`` and remover evict instead). Sequences come from episode tables:
:meth:`TableReplayBuffer.sample_windows` answers ``[B, T]`` TensorDicts.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rlreplay.clients.columns import ColumnBatch
from rlreplay.clients.windows import WindowBatch

__all__ = ["TableReplayBuffer", "window_tensordict"]

_KEY_PREFIX: Final = "td:"
_COUNT_BITS: Final = 40
_MAX_WRITER: Final = (1 << (63 - _COUNT_BITS)) - 1


def window_tensordict(batch: WindowBatch, device: Any = None) -> TensorDict:
    """A window sample as a TensorDict of batch size ``[B, W]``: the step fields, ``mask``,
    and with ``n_step`` ``returns``, ``discount`` and ``("next", field)``; the per-window
    ``priority``, ``_weight`` and ``start`` are expanded over ``W``."""
    tensors = batch.as_torch()
    shape = [len(batch), batch.window]
    fields: dict[str, Any] = dict(tensors.columns)
    fields["mask"] = tensors.mask
    if tensors.returns is not None:
        fields["returns"] = tensors.returns
    if tensors.discount is not None:
        fields["discount"] = tensors.discount
    if tensors.next:
        fields["next"] = TensorDict(dict(tensors.next), batch_size=shape)
    for name, per_window in (
        ("_weight", tensors.weights),
        ("priority", tensors.priorities),
        ("start", tensors.starts),
    ):
        fields[name] = per_window.unsqueeze(1).expand(shape)
    out = TensorDict(fields, batch_size=shape)
    return out if device is None else out.to(device)


class TableReplayBuffer:
    """A replay buffer over the rlreplay table ``table``, for TorchRL code.

    Args:
        client: A synchronous client (``rlreplay.Client``, ``ShardedClient``, or
            ``rlreplay.ray.client(...)``).
        table: The table; made with ``create`` when given and missing.
        batch_size: ``sample()``'s batch size when it is given none.
        priority_key: The field whose value sets an item's priority in ``extend`` and
            ``update_tensordict_priority`` (TorchRL's ``td_error``); reduced per item by
            its maximum.
        create: ``create_table`` keyword arguments (``sampler``, ``max_size``...) to make
            the table when it does not exist.
        writer_id: Names this buffer's items (``[0, 2**23)``); random when None. Writers
            of one table need different ids.
        wait: Pushes answer only once the server applied them (samples see them at once).
        device: Where sampled TensorDicts go (the CPU when None).
        item_batch_dims: Batch dimensions each item keeps past the first (a trajectory of
            ``[T]`` steps per item: 1), so that a sample's batch size is ``[B, T]`` as in
            TorchRL; learned from ``extend`` when None (0 until then).

    Raises:
        ValueError: A writer id out of range.
    """

    def __init__(
        self,
        client: Any,
        table: str,
        *,
        batch_size: int | None = None,
        priority_key: str = "td_error",
        create: Mapping[str, Any] | None = None,
        writer_id: int | None = None,
        wait: bool = True,
        device: Any = None,
        item_batch_dims: int | None = None,
    ) -> None:
        if writer_id is None:
            writer_id = random.SystemRandom().randrange(_MAX_WRITER + 1)
        if not 0 <= writer_id <= _MAX_WRITER:
            raise ValueError(f"writer_id ({writer_id}) must be in [0, {_MAX_WRITER}]")
        self._client = client
        self.table = table
        self._batch_size = batch_size
        self.priority_key = priority_key
        self._writer_id = writer_id
        self._written = 0
        self._wait = wait
        self._device = device
        self._item_dims = item_batch_dims
        if create is not None and table not in {t["name"] for t in client.list_tables()}:
            client.create_table(table, **create)

    # --- what TorchRL's buffers answer -----------------------------------------------------

    @property
    def batch_size(self) -> int | None:
        """``sample()``'s batch size when it is given none."""
        return self._batch_size

    @property
    def write_count(self) -> int:
        """Items this buffer has written."""
        return self._written

    def __len__(self) -> int:
        """Items in the table (every writer's, pending writes included)."""
        return int(self._client.describe_table(self.table)["stats"]["size"])

    def _keys(self, index: Any) -> list[str]:
        flat = torch.as_tensor(index).reshape(-1).tolist()
        return [f"{_KEY_PREFIX}{int(i)}" for i in flat]

    def _next_indices(self, count: int) -> torch.Tensor:
        start = self._written
        if start + count >= 1 << _COUNT_BITS:
            raise OverflowError("this buffer's writer id has written 2**40 items")
        self._written += count
        base = self._writer_id << _COUNT_BITS
        return torch.arange(base + start, base + start + count, dtype=torch.int64)

    def _priorities(self, data: TensorDictBase) -> np.ndarray[Any, Any] | None:
        priority = data.get(self.priority_key, None)
        if priority is None:
            return None
        flat = torch.as_tensor(priority).detach().reshape(data.shape[0], -1)
        return flat.amax(dim=1).double().cpu().numpy()

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        """Push each element of ``data``'s first batch dimension as one item; its indices.

        The items' fields are ``data``'s keys flattened with ``"."`` (``("next", "obs")``
        is ``"next.obs"``); ``index`` is left out and ``priority_key``, when present, sets
        the priorities. ``data`` gets the ``index`` entry, as in TorchRL.
        """
        if data.batch_dims == 0:
            raise ValueError("extend takes a TensorDict with a batch dimension (add: one item)")
        count = int(data.shape[0])
        if self._item_dims is None:
            self._item_dims = data.batch_dims - 1
        index = self._next_indices(count)
        if count == 0:
            return index
        fields = data.exclude("index", "_weight", "priority_weight", "priority")
        self._client.push_columns(
            self.table,
            self._keys(index),
            fields,
            priorities=self._priorities(data),
            wait=self._wait,
        )
        if not data.is_locked:  # each step of an item of [T] steps shares its index
            shown = index.reshape(-1, *[1] * (data.batch_dims - 1)).expand(data.shape)
            data.set("index", shown.to(data.device) if data.device else shown)
        return index

    def add(self, data: TensorDictBase) -> int:
        """Push one item (a TensorDict of no batch dimension); its index."""
        return int(self.extend(data.unsqueeze(0))[0])

    def sample(
        self, batch_size: int | None = None, return_info: bool = False
    ) -> TensorDictBase | tuple[TensorDictBase, dict[str, Any]]:
        """Sample a batch: a TensorDict of ``[batch_size]`` (``[batch_size, T]`` for items
        of ``item_batch_dims`` 1) with the fields, ``index``, ``priority_weight`` and
        ``_weight`` (the table's importance weights: 1.0 but from a prioritized table)
        and ``priority``; with ``return_info``, also those as a dict of ``[batch_size]``.

        Raises:
            RuntimeError: No ``batch_size`` here nor at construction.
            ValueError: A sampled key is not one this adapter writes (``td:<index>``).
        """
        size = batch_size or self._batch_size
        if not size:
            raise RuntimeError("batch_size not given here nor to the buffer")
        batch: ColumnBatch = self._client.sample(self.table, size, layout="columns")
        out = batch.to_tensordict()
        index = torch.tensor([_index(key) for key in batch.keys], dtype=torch.int64)
        weights = np.ones(len(batch)) if batch.weights is None else batch.weights
        weight = torch.from_numpy(np.asarray(weights, dtype=np.float32))
        info = {
            "index": index,
            "priority_weight": weight,
            "_weight": weight,
            "priority": torch.from_numpy(batch.priorities.astype(np.float32)),
        }
        if self._item_dims:
            out.auto_batch_size_(batch_dims=1 + self._item_dims)
        for name, value in info.items():
            out.set(name, value.reshape(-1, *[1] * (out.batch_dims - 1)).expand(out.shape))
        if self._device is not None:
            out = out.to(self._device)
        return (out, info) if return_info else out

    def sample_windows(self, batch_size: int | None = None, **window: Any) -> TensorDict:
        """Sample windows of an episode table (``length``, ``burn_in``, ``n_step``...: the
        client's window options) as a ``[B, W]`` TensorDict (:func:`window_tensordict`)."""
        size = batch_size or self._batch_size
        if not size:
            raise RuntimeError("batch_size not given here nor to the buffer")
        if not window:
            raise TypeError("sample_windows needs window options (length=...)")
        batch: WindowBatch = self._client.sample(self.table, size, **window)
        return window_tensordict(batch, self._device)

    def update_priority(self, index: Any, priority: Any) -> None:
        """Set the priorities of the items at ``index`` (a scalar or one per index)."""
        keys = self._keys(index)
        values = torch.as_tensor(priority, dtype=torch.float64).detach().cpu().reshape(-1)
        if values.numel() == 1 and len(keys) > 1:
            values = values.expand(len(keys))
        if values.numel() != len(keys):
            raise ValueError(f"{values.numel()} priorities for {len(keys)} indices")
        self._client.update_priorities(self.table, dict(zip(keys, values.tolist(), strict=True)))

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Set priorities from a sampled batch: ``data["index"]`` and its
        ``priority_key`` (reduced per item by its maximum)."""
        priorities = self._priorities(data)
        if priorities is None:
            raise KeyError(f"the TensorDict has no {self.priority_key!r} entry")
        index = torch.as_tensor(data.get("index"))
        while index.ndim > 1:  # an item's steps share its index
            index = index[..., 0]
        self.update_priority(index, priorities)

    def empty(self) -> None:
        """Delete every item of the table (every writer's), and reset the write count."""
        while (left := len(self)) > 0:
            batch = self._client.sample(self.table, min(left, 1024), layout="columns")
            self._client.delete(self.table, set(batch.keys))
        self._written = 0

    def state_dict(self) -> dict[str, Any]:
        """What this buffer holds: its table, writer id and write count (the items are
        the server's, which its snapshots keep)."""
        return {
            "table": self.table,
            "writer_id": self._writer_id,
            "write_count": self._written,
            "priority_key": self.priority_key,
            "batch_size": self._batch_size,
            "item_batch_dims": self._item_dims,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Go on from :meth:`state_dict`: the same writer id and count, so indices are not
        reused."""
        self.table = str(state_dict["table"])
        self._writer_id = int(state_dict["writer_id"])
        self._written = int(state_dict["write_count"])
        self.priority_key = str(state_dict["priority_key"])
        self._batch_size = state_dict.get("batch_size")
        self._item_dims = state_dict.get("item_batch_dims")


def _index(key: str) -> int:
    if not key.startswith(_KEY_PREFIX):
        raise ValueError(f"key {key!r} was not written by a TableReplayBuffer (td:<index>)")
    return int(key[len(_KEY_PREFIX) :])
