"""Which stored steps may start a window of a sample request.

An episode table keeps one row per stored step (a *step slot*) with the episode it belongs
to and its number within it; the episode's own row holds its length and how it ended. A
request for windows of ``W = burn_in + length`` steps may start at step ``t`` of an episode
of ``L`` stored steps when (the contract's "Episode tables"):

- ``t % start_every == 0`` (windows start where a recurrent state was stored);
- ``pad`` false: the window lies wholly within the stored steps, ``t + W <= L``;
  ``pad`` true: any stored step (the window may run past the last one, padded);
- with ``n_step: n`` on an episode still open: step ``t' + n`` is stored for every step
  ``t'`` of the window, ``t + W + n <= L`` (padding or not: the last stored step of a
  padded window would lack its ``t' + n``). An ended episode needs nothing more: its
  returns shorten to the steps it has;
- with the table's ``max_times_sampled`` above 0: the start was drawn fewer times.

Everything here is one vectorised pass over the step slots (O(steps held) per request).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rlreplay.app.episodes.episode_table import OPEN, TERMINATED, TRUNCATED

__all__ = ["OPEN", "TERMINATED", "TRUNCATED", "WindowShape", "eligible_starts"]


Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class WindowShape:
    """The window a sample request asks for.

    Attributes:
        length: ``T``, the steps trained on (>= 1).
        burn_in: steps before them that only warm up a recurrent state (>= 0).
        start_every: a window starts only at steps that are a multiple of this (>= 1).
        pad: whether a window may run past the last stored step (zeros, ``mask`` false).
        n_step: ``n`` of n-step returns, or 0 when the request asks for none.
    """

    length: int = 1
    burn_in: int = 0
    start_every: int = 1
    pad: bool = False
    n_step: int = 0

    def __post_init__(self) -> None:
        """Checks each number (the message names the bad one)."""
        for name, value, least in (
            ("length", self.length, 1),
            ("burn_in", self.burn_in, 0),
            ("start_every", self.start_every, 1),
            ("n_step", self.n_step, 0),
        ):
            if value < least:
                raise ValueError(f"{name} ({value}) must be >= {least}")

    @property
    def steps(self) -> int:
        """``W = burn_in + length``: the steps of one window."""
        return self.burn_in + self.length


def eligible_starts(
    window: WindowShape,
    *,
    live: npt.NDArray[np.bool_],
    episode_of: Ints,
    step_of: Ints,
    length: Ints,
    end_kind: npt.NDArray[np.integer],
    times_sampled: Ints | None = None,
    max_times_sampled: int = 0,
) -> Ints:
    """The step slots that may start a window of ``window``'s shape, in slot order.

    Args:
        window: The request's window.
        live: Per step slot: whether it holds a stored step.
        episode_of: Per step slot: the index of its episode (in ``length``, ``end_kind``).
        step_of: Per step slot: its step number within its episode.
        length: Per episode index: the steps it holds.
        end_kind: Per episode index: :data:`OPEN`, :data:`TERMINATED` or :data:`TRUNCATED`.
        times_sampled: Per step slot: windows drawn from it (with ``max_times_sampled``).
        max_times_sampled: The table's limit on draws of one start (0: none).

    Returns:
        The eligible slots, ascending.
    """
    n = len(live)
    episodes = np.where(live, episode_of[:n], 0)
    steps = step_of[:n]
    ep_length = length[episodes]
    ok = live.copy()
    if window.start_every > 1:
        ok &= steps % window.start_every == 0
    if not window.pad:
        ok &= steps + window.steps <= ep_length
    if window.n_step:
        is_open = end_kind[episodes] == OPEN
        ok &= ~is_open | (steps + window.steps + window.n_step <= ep_length)
    if max_times_sampled > 0 and times_sampled is not None:
        ok &= times_sampled[:n] < max_times_sampled
    found: Ints = np.flatnonzero(ok).astype(np.int64, copy=False)
    return found
