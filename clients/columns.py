"""Columnar batches: what ``sample``, ``get_many`` and ``stream`` answer with
``layout="columns"``.

The server stacks each field of the items' values along a new first axis (see the
contract's "Columnar bodies"), so a batch arrives as a handful of arrays rather than one
Python object per item. :class:`ColumnBatch` holds them as NumPy arrays (bfloat16 fields as
:class:`~rlreplay.wire.arrays.BFloat16Array`); :meth:`ColumnBatch.as_torch` gives torch
tensors that share their memory.

The arrays are views of the buffer the answer was read into (:func:`decode_views`), not
copies: the bytes cross the client once, from the socket. That buffer belongs to the
client's pool of receive buffers and is written again only once no array, tensor or view
made from it is left, so a column stays valid, and its own, for as long as anything holds
it; holding a small part keeps the whole buffer (``.copy()`` the part to let it go). A
column whose data is not aligned for its dtype in the answer is copied instead.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import msgspec
import numpy as np
import numpy.typing as npt

from rlreplay.wire.arrays import BFLOAT16, EXT_NDARRAY, BFloat16Array, dtype_info, split_payload
from rlreplay.wire.codec import unpackb
from rlreplay.wire.errors import ReplayError

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

__all__ = ["Column", "ColumnBatch", "column_tensor", "decode_views", "flat_columns"]

#: A stacked field: a NumPy array, or the raw bits of a bfloat16 one.
Column = npt.NDArray[Any] | BFloat16Array


@dataclass(slots=True)
class ColumnBatch:
    """A batch of items as columns.

    Attributes:
        keys: The items' keys, in the order of the columns' first axis.
        columns: Field -> the field of every item's value stacked along a new first axis;
            a 1-D field whose length varies is packed end to end, its int32 offsets
            (``len(keys) + 1``) in ``"<field>.cu_seqlens"``.
        priorities: The items' priorities (float64).
        times_sampled: How often each was sampled (int64).
        probabilities: A sample's probability of each pick in one draw (None for
            ``get_many``).
        weights: A sample's importance-sampling weights (None for ``get_many``).
        missing: The keys ``get_many`` did not find (empty for a sample).
    """

    keys: list[str]
    columns: dict[str, Column]
    priorities: npt.NDArray[np.float64]
    times_sampled: npt.NDArray[np.int64]
    probabilities: npt.NDArray[np.float64] | None = None
    weights: npt.NDArray[np.float64] | None = None
    missing: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, name: str) -> Column:
        """The column of field ``name``."""
        return self.columns[name]

    def as_torch(
        self, device: Any = None, *, non_blocking: bool = False
    ) -> dict[str, torch.Tensor]:
        """The columns as torch tensors (imports torch).

        On the CPU a tensor shares its column's memory; arrays in a byte order other than
        the machine's are converted first (a copy), as torch holds native ones only.

        Args:
            device: Where to put the tensors (``"cuda"``...); the CPU when None.
            non_blocking: Passed to ``Tensor.to`` when moving them.

        Raises:
            TypeError: A column's dtype has no torch dtype (strings, dates).
        """
        return {
            name: column_tensor(name, column, device, non_blocking=non_blocking)
            for name, column in self.columns.items()
        }

    def to_tensordict(self, device: Any = None, *, separator: str = ".") -> TensorDict:
        """The columns as a ``tensordict.TensorDict`` of batch size ``[len(self)]`` (imports
        tensordict): a field named ``"a.b"`` becomes the nested key ``("a", "b")``, as
        :func:`flat_columns` names a nested TensorDict's fields when it is pushed. The
        tensors are :meth:`as_torch`'s (sharing the columns' memory on the CPU).

        Raises:
            TypeError: A column has no torch dtype, or is a packed varying-length field
                (``"<field>.cu_seqlens"``), which has no ``[len(self), ...]`` shape: use
                :meth:`as_torch` for those.
        """
        from tensordict import TensorDict

        ragged = [name for name in self.columns if name.endswith(".cu_seqlens")]
        if ragged:
            raise TypeError(
                f"columns {ragged} pack varying-length fields, which a TensorDict of batch "
                f"size [{len(self)}] cannot hold; use as_torch()"
            )
        flat = TensorDict(self.as_torch(), batch_size=[len(self)])
        tensors = flat.unflatten_keys(separator) if separator else flat
        return tensors if device is None else tensors.to(device)

    @classmethod
    def from_answer(cls, answer: Any) -> ColumnBatch:
        """The batch of a decoded columnar answer (``SampleColumns`` or ``ItemColumns``).

        Raises:
            ReplayError: The answer is not of that shape.
        """
        if not isinstance(answer, Mapping):
            raise ReplayError(f"expected a columnar answer, got {type(answer).__name__}")
        try:
            columns = dict(answer["columns"])
            batch = cls(
                keys=list(answer["keys"]),
                columns=columns,
                priorities=_array(answer["priorities"]),
                times_sampled=_array(answer["times_sampled"]),
                probabilities=_optional(answer.get("probabilities")),
                weights=_optional(answer.get("weights")),
                missing=list(answer.get("missing", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayError(f"malformed columnar answer: {exc!r}") from exc
        if not all(isinstance(c, np.ndarray | BFloat16Array) for c in columns.values()):
            raise ReplayError("malformed columnar answer: a column is not an array")
        return batch


_NATIVE = "<" if sys.byteorder == "little" else ">"


def flat_columns(columns: Any, separator: str = ".") -> Mapping[str, Any]:
    """``columns`` as a mapping of field -> array: a ``tensordict`` ``TensorDict`` (known by
    its ``flatten_keys``) is flattened, a nested key ``("a", "b")`` named ``"a.b"``, its
    tensors moved to the CPU; any other mapping is returned as it is."""
    flatten = getattr(columns, "flatten_keys", None)
    if flatten is None or not hasattr(columns, "batch_size"):
        return columns  # type: ignore[no-any-return]
    flat = flatten(separator)
    return {str(name): flat.get(name).cpu() for name in flat.keys(include_nested=False)}


def column_tensor(
    name: str, column: Column, device: Any = None, *, non_blocking: bool = False
) -> torch.Tensor:
    """One column as a torch tensor sharing its memory on the CPU (see
    :meth:`ColumnBatch.as_torch`; ``name`` is for the error).

    Raises:
        TypeError: The column's dtype has no torch dtype.
    """
    import torch

    if isinstance(column, BFloat16Array):
        tensor = column.to_torch()
    else:
        array = column
        if array.dtype.byteorder not in ("=", "|", _NATIVE):
            array = array.astype(array.dtype.newbyteorder("="))
        try:
            tensor = torch.from_numpy(array)
        except TypeError as exc:
            raise TypeError(f"column {name!r}: {exc}") from exc
    return tensor if device is None else tensor.to(device, non_blocking=non_blocking)


#: What an array view needs of a payload's layout: the payload's length, the bytes before
#: the data and their count, the NumPy dtype, the shape, and what to do after the view is
#: made (:data:`_PLAIN`, :data:`_CHECK_ALIGNED`, :data:`_BFLOAT16`).
_Layout = tuple[int, bytes, int, np.dtype[Any], tuple[int, ...], int]
_PLAIN, _CHECK_ALIGNED, _BFLOAT16 = range(3)
#: The layouts of payloads seen before, by their length. A payload of the same length that
#: starts with the same bytes holds an array of the same dtype and shape (items of one
#: shape: one parse).
_SEEN: dict[int, _Layout] = {}
_SEEN_LIMIT: Final = 1024
#: The layout of the last payload viewed, one tuple so that threads decoding at once never
#: see half of one layout and half of another. A batch of items of one shape meets the same
#: layout again and again: one comparison of its head, no dict lookup (see
#: :func:`_array_view`).
_last: _Layout = (-1, b"", 0, np.dtype(np.uint8), (), _PLAIN)


def _payload_layout(code: int, payload: memoryview) -> _Layout:
    """The layout of an ext-1 payload (from :data:`_SEEN` when met before), remembered as
    the last one.

    Raises:
        ValueError: Another extension type, or a malformed payload.
    """
    global _last
    if code != EXT_NDARRAY:
        raise ValueError(f"unknown msgpack extension type {code}")
    seen = _SEEN.get(len(payload))
    if seen is None or payload[: seen[2]] != seen[1]:
        dtype_str, shape, data = split_payload(payload)
        head = bytes(payload[: len(payload) - len(data)])
        dtype = dtype_info(dtype_str)[2]
        kind = _CHECK_ALIGNED if dtype.alignment > 1 else _PLAIN
        if dtype_str == BFLOAT16:
            kind = _BFLOAT16
        if len(_SEEN) >= _SEEN_LIMIT:
            _SEEN.clear()
        seen = _SEEN[len(payload)] = (len(payload), head, len(head), dtype, shape, kind)
    _last = seen
    return seen


def _array_view(
    code: int, payload: memoryview, ndarray: type[npt.NDArray[Any]] = np.ndarray
) -> npt.NDArray[Any] | BFloat16Array:
    """An ext-1 array as a view of ``payload`` (a copy when its data is misaligned).

    The msgspec ``ext_hook`` of :func:`decode_views`, called once per array of an answer:
    a payload laid out as the last one (same length, same bytes before the data) takes a
    length check, one comparison and the view.

    Raises:
        ValueError: Another extension type, or a malformed payload.
    """
    size, head, skip, dtype, shape, kind = _last
    if len(payload) != size or payload[:skip] != head or code != EXT_NDARRAY:
        size, head, skip, dtype, shape, kind = _payload_layout(code, payload)
    array = ndarray(shape, dtype, payload, skip)
    if kind == _PLAIN:
        return array
    if not array.flags.aligned:
        array = array.copy()
    return BFloat16Array(array) if kind == _BFLOAT16 else array


def _array_view_seen(code: int, payload: memoryview) -> npt.NDArray[Any] | BFloat16Array:
    """:func:`_array_view` without the last layout's shortcut: a dict lookup per array (the
    off arm of ``python -m bench bulk --arms``)."""
    _, _, skip, dtype, shape, kind = _payload_layout(code, payload)
    array: npt.NDArray[Any] = np.ndarray(shape, dtype, payload, skip)
    if kind != _PLAIN and not array.flags.aligned:
        array = array.copy()
    return BFloat16Array(array) if kind == _BFLOAT16 else array


_VIEWS: Final = msgspec.msgpack.Decoder(ext_hook=_array_view)


def decode_views(answer: bytes | bytearray | memoryview) -> Any:
    """Decode a msgpack answer whose arrays are views of ``answer`` (see the module); of
    an immutable ``answer`` (``bytes``: httpx's transport), copies, as arrays are writable.

    Raises:
        ValueError: It is not well-formed msgpack, or holds a malformed array.
    """
    if isinstance(answer, bytes) or (isinstance(answer, memoryview) and answer.readonly):
        return unpackb(answer)
    try:
        return _VIEWS.decode(answer)
    except msgspec.DecodeError:
        return unpackb(answer)  # what msgspec refuses, the codec decodes or explains


def _array(value: Any) -> npt.NDArray[Any]:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"expected an array, got {type(value).__name__}")
    return value


def _optional(value: Any) -> npt.NDArray[Any] | None:
    return None if value is None else _array(value)
