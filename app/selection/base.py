"""The selector plugin interface.

A selector keeps in-memory selection state over a table's items, addressed by
*slots*: small non-negative ints that the table assigns to keys (and reuses after
a delete). It never sees values, only what it asked for in ``index_fields``.
The same classes serve as samplers (``sample``) and as removers: the table asks
``sample(1)`` of a remover and deletes what it names, or, to shrink by ``k`` items at
once, ``evict(k)``, which picks and drops them in one call.

Built-ins live in :mod:`rlreplay.app.selection.registry`; third-party selectors are entry points
of the group ``rlreplay.samplers`` (see ``examples/score_sampler``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

Slots = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


class Selector(ABC):
    """Selection state over slots; subclasses register under ``name``.

    Class attributes:
        name: the ``type`` in a table config.
        index_fields: value fields the engine extracts on insert and passes in ``fields``.
        deterministic: True when ``sample`` always names the same item for the same state
            (FIFO, LIFO, heaps). Descriptive: the table's draw loop treats both kinds alike
            (with ``max_times_sampled`` it re-draws once a pick retires an item).
        weighted: True when ``weights`` returns importance weights other than 1.0
            (descriptive, like ``deterministic``).
    """

    name: ClassVar[str] = ""
    index_fields: ClassVar[frozenset[str]] = frozenset()
    deterministic: ClassVar[bool] = False
    weighted: ClassVar[bool] = False

    @abstractmethod
    def insert(
        self,
        slots: Slots,
        priorities: Floats,
        inserted_at: Floats,
        fields: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Slots that are new to the selector (a replaced key is removed, then inserted)."""

    @abstractmethod
    def remove(self, slots: Slots) -> None:
        """Slots that left the table; each was inserted before."""

    @abstractmethod
    def update(self, slots: Slots, priorities: Floats) -> None:
        """New priorities for slots already present."""

    @abstractmethod
    def sample(self, n: int, rng: np.random.Generator) -> tuple[Slots, Floats]:
        """``n`` draws with replacement: the slots and each draw's probability; never on empty."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of slots held."""

    def place(self, slots: Slots) -> Any:
        """Where ``slots`` (held) stand in this selector's order, for :meth:`put_back`: a
        draw asks before it takes them out. A selector without an order keeps nothing."""
        return None

    def put_back(
        self,
        slots: Slots,
        priorities: Floats,
        inserted_at: Floats,
        fields: Sequence[Mapping[str, Any]] | None,
        place: Any,
    ) -> None:
        """Hold ``slots`` again where :meth:`place` found them: a draw whose answer is refused
        takes back what it retired. By default they are inserted (no order to keep)."""
        self.insert(slots, priorities, inserted_at, fields)

    def draw_mass(self) -> float:
        """The total that draws are proportional to: ``P(i) = mass_i / draw_mass()``.

        A client that spreads a table over several servers splits a batch between them in
        proportion to this figure, so it must be comparable between two selectors of the
        same type. Every item weighs 1 by default (the number held).
        """
        return float(len(self))

    def weights(self, probabilities: Floats, size: int) -> Floats:
        """Importance weights for picks of these probabilities out of ``size`` items."""
        return np.ones_like(probabilities)

    def index_bytes(self) -> int:
        """Bytes of memory the selection state takes (for stats and benchmarks)."""
        return 0

    def evict(self, k: int, rng: np.random.Generator) -> Slots:
        """Picks ``k`` distinct slots the way a remover would, one after another, and drops them.

        A table that must shrink by ``k`` items calls this on its remover, then removes the
        slots returned from its sampler and its storage (not from this selector again).
        The result is what ``k`` rounds of ``sample(1)`` followed by ``remove`` would give;
        that is the default, and selectors override it with something faster.

        Args:
            k: how many slots to pick, at most ``len(self)``.
            rng: the table's random generator.

        Returns:
            The ``k`` slots, in the order they were picked.
        """
        picked = np.empty(k, dtype=np.int64)
        for i in range(k):
            slot = self.sample(1, rng)[0][:1]
            self.remove(slot)
            picked[i] = slot[0]
        return picked
