"""n-step returns over sampled windows, with Gymnasium's two kinds of episode end.

For each returned step ``t`` of an episode that holds ``L`` steps (the contract's "Episode
tables"):

- ``n' = min(n, L - t)`` once the episode has ended, ``n`` while it is open (an open
  episode's window is drawn only when ``t + n`` is stored for each of its steps);
- ``return = Σ_{j<n'} gamma^j · reward[t + j]``;
- ``discount = gamma^n'``, or 0 when the episode ended ``terminated`` and ``t + n' = L`` (no
  value after a terminal step); a ``truncated`` episode keeps ``gamma^n'`` and bootstraps from
  its ``final`` observation;
- ``next`` is the value at step ``t + n'``: the ``final`` value when ``t + n' = L``.

Padded steps have ``return`` 0 and ``discount`` 0, and no next step.

Everything is computed for a whole batch at once: one array operation per ``j < n``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rlreplay.app.episodes.window_starts import OPEN, TERMINATED

__all__ = ["NStepTargets", "nstep_targets"]

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class NStepTargets:
    """The n-step targets of a batch of windows, each ``[B, W]``.

    Attributes:
        returns: ``Σ_{j<n'} gamma^j · reward[t + j]`` (0 on padded steps).
        discounts: ``gamma^n'``, 0 after a terminal step and on padded steps.
        next_steps: ``t + n'``, the step whose values are ``next`` (the episode's length
            for its ``final``); -1 on padded steps.
    """

    returns: Floats
    discounts: Floats
    next_steps: Ints


def nstep_targets(
    *,
    starts: Ints,
    lengths: Ints,
    end_kinds: npt.NDArray[np.integer],
    rewards: Floats,
    steps: int,
    n: int,
    gamma: float,
) -> NStepTargets:
    """The targets of ``B`` windows of ``steps`` steps.

    Args:
        starts: ``[B]`` the first step of each window.
        lengths: ``[B]`` the steps its episode holds.
        end_kinds: ``[B]`` how it ended (``OPEN``, ``TERMINATED``, ``TRUNCATED``).
        rewards: ``[B, steps + n - 1]``: ``reward[start + i]``, any value where
            ``start + i`` is past the episode (it is not read).
        steps: ``W``.
        n: ``n`` (>= 1).
        gamma: ``gamma``.

    Returns:
        The returns, discounts and next steps.
    """
    t = starts[:, None] + np.arange(steps, dtype=np.int64)[None, :]
    length = lengths[:, None]
    valid = t < length
    ended = (end_kinds != OPEN)[:, None]
    n_prime = np.where(ended, np.minimum(n, length - t), n)
    n_prime = np.where(valid, n_prime, 0)
    # gamma^j as Python computes it, so a plain loop over the steps gives the same bits
    powers = np.asarray([gamma**j for j in range(n + 1)], dtype=np.float64)
    returns = np.zeros(t.shape, dtype=np.float64)
    for j in range(n):
        term = powers[j] * rewards[:, j : j + steps]
        returns = np.where(j < n_prime, returns + term, returns)
    terminal = (end_kinds == TERMINATED)[:, None] & (t + n_prime == length)
    discounts = np.where(valid & ~terminal, powers[n_prime], 0.0)
    next_steps = np.where(valid, t + n_prime, -1).astype(np.int64)
    return NStepTargets(returns, discounts, next_steps)
