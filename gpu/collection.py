"""Collecting chosen items' values into device tensors.

One ``items:batchGet`` with ``layout: "columns"`` fetches the distinct keys of a batch: the
server stacks each field of their values (a variable-length 1-D field packed end to end,
with its ``cu_seqlens``). The answer's arrays are not decoded into objects: each is a view
of the answer's bytes, copied once into a host buffer (repeated picks expanded during that
copy) and from there to the device. On CUDA the host buffers are pinned and reused, and the
copies to the device are non-blocking; a buffer is written again only once the copy that
read it has finished (a CUDA event per buffer). On the CPU the host buffer is the batch's
own tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import torch

from rlreplay.clients.client import ReplayClient
from rlreplay.wire.arrays import BFLOAT16, EXT_NDARRAY, dtype_info, split_payload
from rlreplay.wire.errors import ReplayError, ValidationFailed

__all__ = ["CU_SEQLENS", "BatchTooLarge", "Collector", "MissingItems", "PinnedPool"]

CU_SEQLENS = ".cu_seqlens"


class MissingItems(ReplayError):
    """Keys chosen from the device index were gone when their values were fetched (deleted
    on the server after the index saw them): the caller catches up and draws again."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(f"{len(keys)} chosen items were deleted meanwhile: {keys[:3]}")
        self.keys = keys


class BatchTooLarge(ValidationFailed):
    """A batch would hold more bytes of keys and values than its limit allows: refused
    before its columns are built (422 ``validation_error``, as the server refuses a sample
    past its ``--max-response-mb``)."""

    def __init__(self, nbytes: int, picks: int, limit: int) -> None:
        super().__init__(
            f"a sample of {picks} picks would answer {nbytes / 2**20:.1f} MB of keys and "
            f"values, past the limit of {limit / 2**20:g} MB a batch; ask for fewer"
        )
        self.nbytes = nbytes
        self.picks = picks
        self.limit = limit


@dataclass(frozen=True, slots=True)
class _View:
    """An array of the answer, not copied: dtype string, shape, bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: memoryview


def _view_hook(code: int, payload: memoryview) -> _View:
    if code != EXT_NDARRAY:
        raise ValueError(f"unknown msgpack extension type {code}")
    return _View(*split_payload(payload))


_DECODER = msgspec.msgpack.Decoder(ext_hook=_view_hook)


class PinnedPool:
    """Reusable pinned host buffers on CUDA, each free again once its copy is done.

    ``take(nbytes)`` hands out the next buffer of a small ring, grown (doubled) when too
    small, after waiting for the event recorded when it was last copied from.
    """

    def __init__(self, device: torch.device, slots: int = 3) -> None:
        self.device = device
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._events: list[torch.cuda.Event | None] = [None] * slots
        self._next = 0

    def take(self, nbytes: int) -> tuple[int, torch.Tensor]:
        """A pinned byte buffer of at least ``nbytes`` and its ring position."""
        at = self._next
        self._next = (at + 1) % len(self._buffers)
        event = self._events[at]
        if event is not None:
            event.synchronize()  # the copy that read it last is done
        buf = self._buffers[at]
        if buf is None or buf.numel() < nbytes:
            size = max(nbytes, 2 * (0 if buf is None else buf.numel()), 1 << 20)
            buf = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            self._buffers[at] = buf
        return at, buf

    def copied(self, at: int) -> None:
        """The copies out of buffer ``at`` are queued: mark when they finish."""
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self.device))
        self._events[at] = event


class Collector:
    """Fetches items' fields into tensors on ``device``.

    Args:
        client: The replay service's client.
        table: The table.
        device: Where the tensors go.
    """

    def __init__(self, client: ReplayClient, table: str, device: torch.device) -> None:
        self.client = client
        self.table = table
        self.device = device
        self._pool = PinnedPool(device) if device.type == "cuda" else None
        #: bytes copied to the device so far (for /metrics and benchmarks)
        self.bytes_collected = 0

    async def collect(
        self,
        keys: Sequence[str],
        inverse: npt.NDArray[np.int64] | None,
        fields: Sequence[str],
        *,
        limit: int | None = None,
        reserved: int = 0,
    ) -> dict[str, torch.Tensor]:
        """The ``fields`` of the distinct ``keys``' values, for picks ``keys[inverse]``
        (``keys`` themselves when ``inverse`` is None).

        Each field comes stacked along a new first axis, one row per pick; a
        variable-length 1-D field packed end to end with an int32 ``"<field>.cu_seqlens"``.

        Args:
            keys: The distinct keys to fetch.
            inverse: Which key each pick is (None: one pick per key, in order).
            fields: The fields to collect.
            limit: The most bytes the batch may hold (None: no limit).
            reserved: Bytes of the batch already spoken for (its keys).

        Raises:
            MissingItems: Some keys are gone on the server.
            ValidationFailed: A field is in no value, or the values do not stack.
            BatchTooLarge: The picks' fields and ``reserved`` come to more than ``limit``.
        """
        if not fields:
            return {}
        packed = await self.client.get_many_packed(self.table, keys)
        return self.place(packed, inverse, fields, limit=limit, reserved=reserved)

    def place(
        self,
        packed: bytes,
        inverse: npt.NDArray[np.int64] | None,
        fields: Sequence[str],
        *,
        limit: int | None = None,
        reserved: int = 0,
    ) -> dict[str, torch.Tensor]:
        """:meth:`collect`'s work once the columnar answer's bytes are here: the picks'
        size checked against ``limit`` before anything is allocated for them, then each
        field copied out of the answer into host memory (pinned on CUDA) and on to the
        device.

        Raises:
            MissingItems, ValidationFailed, BatchTooLarge: As :meth:`collect`.
        """
        answer = _DECODER.decode(packed)
        if answer.get("missing"):
            raise MissingItems(list(answer["missing"]))
        columns: dict[str, _View] = answer["columns"]
        planned: list[tuple[str, torch.dtype, npt.NDArray[Any], npt.NDArray[np.int64] | None]]
        planned = []
        nbytes = reserved
        for name in fields:
            view = columns.get(name)
            if view is None:
                raise ValidationFailed(f"field {name!r} is not in the items' values")
            tdtype, src = _source(view)
            cu = columns.get(name + CU_SEQLENS)
            offsets = None if cu is None else _source(cu)[1].astype(np.int64)
            nbytes += _picked_bytes(src, offsets, inverse)
            planned.append((name, tdtype, src, offsets))
        if limit is not None and nbytes > limit:
            picks = len(planned[0][2]) if inverse is None else len(inverse)
            raise BatchTooLarge(nbytes, picks, limit)
        shaped: list[tuple[str, torch.dtype, npt.NDArray[Any]]] = []
        for name, tdtype, src, offsets in planned:
            if offsets is None:
                shaped.append((name, tdtype, src if inverse is None else src[inverse]))
                continue
            if inverse is None:
                shaped.append((name, tdtype, src))
                shaped.append((name + CU_SEQLENS, torch.int32, offsets.astype(np.int32)))
                continue
            lengths = np.diff(offsets)[inverse]
            new_cu = np.zeros(len(inverse) + 1, dtype=np.int64)
            np.cumsum(lengths, out=new_cu[1:])
            take = np.repeat(offsets[:-1][inverse] - new_cu[:-1], lengths)
            take += np.arange(int(new_cu[-1]), dtype=np.int64)
            shaped.append((name, tdtype, src[take]))
            shaped.append((name + CU_SEQLENS, torch.int32, new_cu.astype(np.int32)))
        return self._transfer(shaped)

    def _transfer(
        self, shaped: list[tuple[str, torch.dtype, npt.NDArray[Any]]]
    ) -> dict[str, torch.Tensor]:
        """Copies each field once into host memory and from there to the device."""
        self.bytes_collected += sum(a.nbytes for _, _, a in shaped)
        if self._pool is None:
            return {name: _host(tdtype, array) for name, tdtype, array in shaped}
        padded = sum(a.nbytes + (-a.nbytes) % 64 for _, _, a in shaped)
        at, buf = self._pool.take(padded)
        out: dict[str, torch.Tensor] = {}
        offset = 0
        for name, tdtype, array in shaped:
            host = buf[offset : offset + array.nbytes]
            np.copyto(host.numpy().view(array.dtype).reshape(array.shape), array, casting="no")
            out[name] = host.view(tdtype).view(array.shape).to(self.device, non_blocking=True)
            offset += array.nbytes + (-array.nbytes) % 64  # each field's start aligned
        self._pool.copied(at)
        return out


def _picked_bytes(
    src: npt.NDArray[Any],
    offsets: npt.NDArray[np.int64] | None,
    inverse: npt.NDArray[np.int64] | None,
) -> int:
    """Bytes a field takes once laid out for the picks (its ``cu_seqlens`` included),
    reckoned from the distinct items' arrays without building it."""
    rows = len(src) if inverse is None else len(inverse)
    if offsets is None:
        per_row = src.nbytes // len(src) if len(src) else 0
        return per_row * rows
    lengths = np.diff(offsets)
    elements = int(lengths.sum() if inverse is None else lengths[inverse].sum())
    return elements * src.itemsize + 4 * (rows + 1)


def _source(view: _View) -> tuple[torch.dtype, npt.NDArray[Any]]:
    """The torch dtype of an answer's array, and the array over the answer's bytes (in
    native byte order: converted, a copy, only when sent in the other one)."""
    if view.dtype == BFLOAT16:
        return torch.bfloat16, np.frombuffer(view.data, dtype=np.uint16).reshape(view.shape)
    np_dtype = dtype_info(view.dtype)[2]
    array = np.frombuffer(view.data, dtype=np_dtype).reshape(view.shape)
    if not np_dtype.isnative:
        array = array.astype(np_dtype.newbyteorder("="))
    try:
        tdtype = torch.from_numpy(np.empty(0, dtype=array.dtype)).dtype
    except TypeError as exc:
        raise ValidationFailed(f"dtype {view.dtype!r} has no torch dtype") from exc
    return tdtype, array


def _host(tdtype: torch.dtype, array: npt.NDArray[Any]) -> torch.Tensor:
    """A fresh CPU tensor holding ``array`` (one copy)."""
    tensor = torch.empty(array.shape, dtype=tdtype)
    target = tensor.view(torch.uint16) if tdtype == torch.bfloat16 else tensor
    np.copyto(target.numpy().view(array.dtype), array, casting="no")
    return tensor
